#!/bin/bash
# Are two ucp binaries' outputs byte-identical on the fixtures? For a refactor
# that must not change one byte (issue 23's acceptance): every checkpoint
# folder under the ROOTs (discovered as tools/verify_fixtures_test.sh does) is
# run through inspect, verify, convert, reshard (tp1 pp1 dp1, and dp2) and
# export (safetensors) by both binaries with the same flags; their exit codes,
# their messages (the binaries' own paths and the scratch folders taken out)
# and every byte of every file they write must be equal. A refusal is compared
# like a success: the same refusal is the same output.
#
#   tools/same_outputs.sh OLD_UCP NEW_UCP [ROOT...]   (default roots:
#       ../shared/fixtures and testdata)
# Prints one line per folder and command that differs, and a summary; exit 1
# when anything differs. Needs about 3x the largest fixture in $TMPDIR.
set -u
OLD=$(readlink -f "$1"); NEW=$(readlink -f "$2"); shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- "$here/../shared/fixtures" "$here/testdata"
work=$(mktemp -d "${TMPDIR:-/tmp}/same_outputs.XXXXXX")
trap 'rm -rf "$work"' EXIT

list="$work/list"
for root in "$@"; do
  find -L "$root" -type d \( -name 'global_step*' -o -name 'resaved-*' -o -name '*_universal*' \) \
    -not -path '*/hostile/*' -print >> "$list"
  find -L "$root" \( -name latest -o -name latest_universal \) -type f -not -path '*/hostile/*' \
    -printf '%h\n' >> "$list"
done
sort -u "$list" -o "$list"

# run SIDE NAME ARGS...: one command of binary SIDE (old|new) into $work/SIDE;
# OUT in the arguments stands for that side's output folder.
run() {
  local side=$1 name=$2; shift 2
  local bin; [ "$side" = old ] && bin=$OLD || bin=$NEW
  local out="$work/$side/out"
  rm -rf "$work/$side"; mkdir -p "$work/$side"
  local args=() arg; for arg in "$@"; do args+=("${arg//OUT/$out}"); done
  "$bin" "${args[@]}" > "$work/$side/msg" 2>&1
  echo "exit $?" >> "$work/$side/msg"
  sed -i -e "s#$work/$side#SCRATCH#g" -e "s#$bin#UCP#g" "$work/$side/msg"
  if [ -e "$out" ]; then
    (cd "$out" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum) > "$work/$side/tree"
  else
    echo "no output" > "$work/$side/tree"
  fi
  mv "$work/$side" "$work/$side.$name"
}

n=0; diffs=0; wrote=0
while IFS= read -r d; do
  for cmd in inspect verify convert reshard1 reshard2 export; do
    case $cmd in
      inspect) a=(inspect "$d") ;;
      verify) a=(verify "$d") ;;
      convert) a=(convert --input_folder="$d" --output_folder=OUT --fsync=false --progress=never) ;;
      reshard1) a=(reshard --input_folder="$d" --output_folder=OUT --tp=1 --pp=1 --dp=1 --fsync=false --progress=never) ;;
      reshard2) a=(reshard --input_folder="$d" --output_folder=OUT --tp=1 --pp=1 --dp=2 --fsync=false --progress=never) ;;
      export) a=(export --input_folder="$d" --output_folder=OUT --fsync=false --progress=never) ;;
    esac
    run old "$cmd" "${a[@]}"; run new "$cmd" "${a[@]}"
    n=$((n + 1))
    grep -q '^no output$' "$work/new.$cmd/tree" || wrote=$((wrote + 1))
    if ! cmp -s "$work/old.$cmd/msg" "$work/new.$cmd/msg" || ! cmp -s "$work/old.$cmd/tree" "$work/new.$cmd/tree"; then
      diffs=$((diffs + 1))
      echo "DIFFERS $cmd $d"
      diff "$work/old.$cmd/msg" "$work/new.$cmd/msg" | head -10
      diff "$work/old.$cmd/tree" "$work/new.$cmd/tree" | head -10
    fi
    rm -rf "$work/old.$cmd" "$work/new.$cmd"
  done
done < "$list"
echo "$n runs on $(wc -l < "$list") folders ($wrote wrote an output), $diffs differ"
[ "$diffs" = 0 ]
