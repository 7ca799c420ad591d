#!/bin/bash
# A fuzz campaign: every target in parallel for SECONDS each (one libFuzzer process per
# target, in fork mode so that a crash or timeout is saved and the campaign goes on),
# starting from DIR/corpus/TARGET, then each grown corpus minimised with -merge=1.
#
#   fuzz/campaign.sh SECONDS DIR
#
# DIR holds bin/TARGET (binaries from `cargo fuzz build -O -a -s none`, under
# fuzz/target/x86_64-unknown-linux-gnu/release/) and corpus/TARGET/ (a copy of
# fuzz/corpus/). Results go to $OUT (default DIR/out): summary.txt (each target's last
# status line, corpus sizes, artifacts) and result.tgz (m/TARGET: the minimised corpora to
# copy back to fuzz/corpus/; art/TARGET: crashes and timeouts; logs/).
set -u
T=$1
cd "$2"
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
W=$(mktemp -d)
TARGETS=$(ls bin)
for t in $TARGETS; do
  mkdir -p $W/c/$t $W/art/$t $W/m/$t $W/logs
  cp corpus/$t/* $W/c/$t/ 2>/dev/null
  echo "bin/$t -fork=1 -ignore_crashes=1 -timeout=10 -max_total_time=$T -artifact_prefix=art/$t/ c/$t" \
    > $W/logs/$t.cmd
  bin/$t -fork=1 -ignore_crashes=1 -timeout=10 -max_total_time=$T \
    -artifact_prefix=$W/art/$t/ $W/c/$t > $W/logs/$t.log 2>&1 &
done
wait
for t in $TARGETS; do
  bin/$t -merge=1 $W/m/$t $W/c/$t > $W/logs/$t.merge.log 2>&1 &
done
wait
{
  for t in $TARGETS; do
    echo "== $t"
    grep -E '^#[0-9]+' $W/logs/$t.log | tail -1
    grep -E 'fuzzed for' $W/logs/$t.log
    echo "corpus before merge: $(ls $W/c/$t | wc -l) files"
    echo "merged: $(ls $W/m/$t | wc -l) files, $(cat $W/m/$t/* | wc -c) bytes"
    grep -E 'MERGE-OUTER: [0-9]+ new files' $W/logs/$t.merge.log
    echo "artifacts: $(ls $W/art/$t | wc -l)"
  done
} > "$OUT/summary.txt"
tar czf "$OUT/result.tgz" -C $W m art logs
cat "$OUT/summary.txt"
