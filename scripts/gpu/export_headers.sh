#!/usr/bin/env bash
# ON the GPU machine: packs the headers a CUDA build of volt compiles against (the torch wheel's
# include/, the CUDA toolkit's and the nvidia-* wheels' include/ folders, without the big
# template libraries volt does not include) into $1 (default /tmp/h/hdr.tar.xz), so that
# scripts/gpu/check_syntax.sh can compile volt's sources against torch 2.x + CUDA on the
# development machine (syntax and types only; nothing links there). The device tool brings files
# back in parts of at most 16 MiB: split the archive into $OUT.
set -u
dst=${1:-/tmp/h/hdr.tar.xz}
mkdir -p "$(dirname "$dst")" /tmp/h
tdir=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
site=$(dirname "$tdir")
list=$(mktemp)
echo "${tdir#/}/include" > "$list"
for d in /usr/local/cuda/include "$site"/nvidia/*/include "$site"/nvidia/*/*/include; do
  [ -d "$d" ] && echo "${d#/}" >> "$list"
done
python3 -c 'import torch;print(torch.__version__, torch.version.cuda)' > /tmp/h/VERSION
echo "$tdir" >> /tmp/h/VERSION
cat "$list" >> /tmp/h/VERSION
echo tmp/h/VERSION >> "$list"
tar -C / -chf - --exclude='*/thrust' --exclude='*/cub' -T "$list" 2>/dev/null | xz -T8 -6 > "$dst"
ls -l "$dst"
