#!/usr/bin/env bash
# What one uncontended lock + unlock costs the client, in instructions:
# repeatable on a shared, loaded machine where CPU time is not. Runs the
# `cycles` bench under `valgrind --tool=callgrind` twice (N1 and N2
# cycles) and divides the difference of the totals by N2 - N1, so start-up
# and warm-up cancel out. The redis-server it starts runs outside valgrind.
#
#   scripts/client-cost.sh                 # every placement, fenced / unfenced / raw
#   scripts/client-cost.sh task fenced     # one of them
#
# Placements: task (a task of a multi-thread runtime), current (a
# current-thread runtime), block_on (a multi-thread runtime's `block_on`).
# `raw`: two raw round trips (`SET NX PX`, `DEL`) with the `redis` crate
# from the same placement; `attribute`: an empty `#[distributed_lock]` fn;
# `rslock`: rslock's lock + unlock. Note: valgrind counts each byte a `rep movsb`
# copies as an instruction, so large memory copies weigh more here than in
# time.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind" >&2; exit 1; }
bin=$(cargo bench -p tests --bench cycles --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*\/cycles-[^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "could not build the cycles bench" >&2; exit 1; }
n1=${N1:-100}
n2=${N2:-600}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
total() {
  CYCLES_N=$1 CYCLES_WHERE=$2 CYCLES_WHAT=$3 valgrind --tool=callgrind \
    --callgrind-out-file="$out/cg.%p" "$bin" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
places=${1:-"task current block_on"}
whats=${2:-"raw fenced unfenced attribute rslock"}
for w in $places; do
  for x in $whats; do
    a=$(total "$n1" "$w" "$x")
    b=$(total "$n2" "$w" "$x")
    echo "$w $x: $(((b - a) / (n2 - n1))) instructions per cycle"
  done
done
