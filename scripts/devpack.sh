#!/usr/bin/env bash
# Packs the Python packages the H200 machine does not have (it reaches no package registry) into
# small archives that travel with the working tree (the tree may carry 64 MiB in all).
#
#   bash scripts/devpack.sh [fla] [tilelang] [nixl] [deepgemm] [serve] [xgrammar]
#                                                                     (no argument: fla tilelang)
#
# Writes .devpack/<pack>.tar.xz in the repository (git-ignored through .git/info/exclude) and keeps
# built archives in ~/.cache/glmlab-devpack. Wheels are cp312 manylinux builds (the H200 machine has
# Python 3.12, torch 2.11, triton 3.6), downloaded without dependencies and unzipped; the parts no
# run needs are dropped (nixl's EP kernels and scripts, z3's headers, z3's duplicate library).
# On the GPU machine, with .devpack carried:
#   SITE=$(mktemp -d); for p in .devpack/*.tar.xz; do tar -xJf "$p" -C "$SITE"; done
#   export PYTHONPATH=$SITE
set -euo pipefail
cd "$(dirname "$0")/.."
packs=("$@"); [ ${#packs[@]} -eq 0 ] && packs=(fla tilelang)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/glmlab-devpack
mkdir -p "$cache" .devpack
if [ -d .git/info ] && ! grep -qx '/.devpack/' .git/info/exclude 2>/dev/null; then
  echo '/.devpack/' >> .git/info/exclude
fi
platforms=""
for n in 28 27 24 17; do platforms="$platforms --platform manylinux_2_${n}_x86_64"; done
download="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
  --platform manylinux2014_x86_64"

wheels_of() {
  case "$1" in
    fla) echo "fla-core==0.6.0 flash-linear-attention==0.6.0" ;;
    tilelang) echo "tilelang==0.1.15 apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5 z3-solver==4.15.4.0" ;;
    nixl) echo "nixl-cu13==1.5.1" ;;
    deepgemm) echo "sgl-deep-gemm==0.2.3.post2" ;;
    # what glmlab serve needs beyond the H200 image (which has httpx, aiohttp, prometheus-client,
    # anyio, h11, click): the web framework and its validation library, pinned as the serve extra
    serve) echo "fastapi==0.165.0 starlette uvicorn==0.54.0 pydantic pydantic-core annotated-types
                 annotated-doc opentelemetry-api typing-extensions
                 typing-inspection" ;;
    # structured output (the serve extra's grammar engine); it needs apache-tvm-ffi (tilelang's
    # pack) and pydantic (serve's)
    xgrammar) echo "xgrammar==0.2.9" ;;
    *) echo "unknown pack: $1 (fla, tilelang, nixl, deepgemm, serve, xgrammar)" >&2; return 2 ;;
  esac
}

build() {  # $1 = pack name, $2 = archive to write
  local wheels site spec f d sub
  wheels=$(mktemp -d); site=$(mktemp -d)
  for spec in $(wheels_of "$1"); do
    python3 -m pip download -q $download -d "$wheels" "$spec"
  done
  for f in "$wheels"/*.whl; do (cd "$site" && unzip -q -o "$f"); done
  for d in "$site"/*.data; do  # a wheel's .data/{purelib,platlib} belongs on the path itself
    [ -d "$d" ] || continue
    for sub in purelib platlib; do [ -d "$d/$sub" ] && cp -a "$d/$sub/." "$site/"; done
    rm -rf "$d"
  done
  rm -rf "$site/nixl_ep_cu13" "$site/nixl_cu13.scripts" "$site/z3/include"
  if [ -f "$site/z3/lib/libz3.so.4.15" ] && [ -f "$site/z3/lib/libz3.so" ] \
      && [ ! -L "$site/z3/lib/libz3.so" ]; then
    ln -sf libz3.so.4.15 "$site/z3/lib/libz3.so"
  fi
  tar -C "$site" -cf - . | xz -6 -T2 > "$2.tmp" && mv "$2.tmp" "$2"
  rm -rf "$wheels" "$site"
}

for pack in "${packs[@]}"; do
  wheels_of "$pack" >/dev/null
  archive="$cache/$pack.tar.xz"
  [ -s "$archive" ] || build "$pack" "$archive"
  cp "$archive" ".devpack/$pack.tar.xz"
  echo "$(du -h ".devpack/$pack.tar.xz" | cut -f1)  .devpack/$pack.tar.xz"
done
echo "carried: $(du -ch .devpack/*.tar.xz | tail -1 | cut -f1) (64 MiB limit with the rest of the tree)"
