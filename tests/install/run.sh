#!/usr/bin/env bash
# Installs the built volt into a temporary prefix, then configures, builds and runs an
# out-of-tree consumer that uses find_package(volt) and links volt::volt.
set -euo pipefail
build_dir=$1
consumer_src=$2
work=$(mktemp -d /tmp/volt_install_XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
# With ccache, everything the compile sees sits in $work (the consumer's sources copied there),
# named relative to it: the same key in every run and clone, so an unchanged consumer and
# unchanged installed headers come from the cache. The install gives the headers new mtimes.
cp -r "$consumer_src" "$work/src"
launcher=()
if command -v ccache > /dev/null; then
  export CCACHE_BASEDIR=$work
  export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:+$CCACHE_SLOPPINESS,}include_file_mtime,include_file_ctime"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
out=$("$work/build/consumer")
echo "$out"
grep -q "consumer ok" <<< "$out"
