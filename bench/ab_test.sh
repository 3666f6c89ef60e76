#!/usr/bin/env bash
# bench/ab.sh on a real checkpoint: two identical builds give identical
# outputs and exit 0 with both builds' seconds; a build whose output differs
# by one byte makes it exit 1 naming the file; bad arguments are refused;
# the source is never written. (No figure is asserted: timings are noise here.)
set -euo pipefail
UCP=$(readlink -f "$1")
FX=$(readlink -f "$2")   # the deepspeed-0.14.4 fixtures folder
AB=$(readlink -f "$3")
W=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
checks=0

src=$W/src/global_step4
mkdir -p "$(dirname "$src")"
cp -rL "$FX/neox-tp2-pp1-dp2/global_step4" "$src"
before=$(cd "$src" && find . -type f -exec sha256sum {} + | sort)

# Two copies of the same build: identical outputs, both timed every run.
cp "$UCP" "$W/ucp-a"
cp "$UCP" "$W/ucp-b"
for op in convert reshard-z export; do
  out=$("$AB" --a="$W/ucp-a" --b="$W/ucp-b" --source="$src" --op="$op" --runs=2 --drop=0 --workdir="$W/work-$op")
  grep -q "^a $W/ucp-a: [0-9.]* [0-9.]* s (median " <<<"$out" || { echo "$out"; fail "$op: no two timings of a"; }
  grep -q "^b $W/ucp-b: [0-9.]* [0-9.]* s (median " <<<"$out" || { echo "$out"; fail "$op: no two timings of b"; }
  grep -q "^median b / a: [0-9]*%" <<<"$out" || { echo "$out"; fail "$op: no ratio"; }
  grep -q "^outputs: identical$" <<<"$out" || { echo "$out"; fail "$op: the same build's outputs differ"; }
  [[ ! -e "$W/work-$op" ]] || fail "$op: the work folder was left behind"
  checks=$((checks + 1))
done
# Two ranks, and flags passed through to ucp (another target topology).
out=$("$AB" --a="$W/ucp-a" --b="$W/ucp-b" --source="$src" --op=reshard-z --ranks=2 --runs=1 --drop=0 \
  --workdir="$W/work-np2" -- --dp=2)
grep -q "reshard-z, 2 rank(s), warm, 1 run(s) each, source $src --dp=2" <<<"$out" || { echo "$out"; fail "np 2: header"; }
grep -q "^outputs: identical$" <<<"$out" || { echo "$out"; fail "np 2: outputs differ"; }
checks=$((checks + 1))

# A build whose output differs in one byte: exit 1, the file named.
cat >"$W/ucp-bad" <<SH
#!/usr/bin/env bash
"$W/ucp-a" "\$@" || exit
for a in "\$@"; do case "\$a" in --output_folder=*) out="\${a#*=}" ;; esac; done
f=\$(find "\$out" -name 'fp32.pt' | sort | head -1)
printf x >>"\$f"
SH
chmod +x "$W/ucp-bad"
set +e
out=$("$AB" --a="$W/ucp-a" --b="$W/ucp-bad" --source="$src" --op=convert --runs=1 --drop=0 --workdir="$W/work-bad" 2>&1)
rc=$?
set -e
[[ $rc -eq 1 ]] || { echo "$out"; fail "a differing output: exit $rc, expected 1"; }
grep -q "fp32.pt" <<<"$out" || { echo "$out"; fail "the differing file is not named"; }
grep -q "^outputs: DIFFERENT$" <<<"$out" || { echo "$out"; fail "no DIFFERENT verdict"; }
checks=$((checks + 1))

# Bad arguments: refused (exit 2) with the argument named.
expect_refused() {
  local what=$1; shift
  set +e
  out=$("$AB" "$@" 2>&1)
  rc=$?
  set -e
  [[ $rc -eq 2 ]] || { echo "$out"; fail "$what: exit $rc, expected 2"; }
  grep -qF -- "$what" <<<"$out" || { echo "$out"; fail "the message does not name $what"; }
  checks=$((checks + 1))
}
expect_refused "--op=reshard-u" --a="$W/ucp-a" --b="$W/ucp-b" --source="$src" --op=reshard-u
expect_refused "--b=UCP" --a="$W/ucp-a" --b="$W/missing" --source="$src"
expect_refused "--cache=cold needs root" --a="$W/ucp-a" --b="$W/ucp-b" --source="$src" --cache=cold --drop=0
expect_refused "inside the source" --a="$W/ucp-a" --b="$W/ucp-b" --source="$src" --workdir="$src/work"
expect_refused "unknown argument" --a="$W/ucp-a" --b="$W/ucp-b" --source="$src" --run=2

after=$(cd "$src" && find . -type f -exec sha256sum {} + | sort)
[[ "$before" == "$after" ]] || fail "the source changed"
checks=$((checks + 1))
echo "PASS: $checks checks"
