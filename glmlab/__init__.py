"""glmlab: study and serve GLM-5.3-Flash."""
