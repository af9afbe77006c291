# Shared by the drafter benchmark scripts (sourced, not run): arguments
# OUT_DIR N_PREDICT THREADS, the committed support files, a release build, and
# run NAME FLAGS… (one `tandem bench` over the dev prompts; its log and CSV go
# to OUT_DIR/NAME, and the lines matching $show are echoed).
out=${1:?out dir}
n=${2:-128}
t=${3:-2}
prompts=../shared/bench/prompts-dev.jsonl
mtp=models/support/smollm2-135m-instruct-mtp.gguf
dspark=models/support/smollm2-135m-instruct-dspark.gguf
show=${show:-overall|spec:|identical|EXACTNESS}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q
bin=./target/release/tandem
run() {
    local name=$1; shift
    echo "== $name: $*" >&2
    "$bin" bench --prompts "$prompts" -n "$n" --threads "$t" --spec-stats --out-dir "$out/$name" "$@" 2>&1 | tee "$out/$name.log" | grep -E "$show" || true
}
mkdir -p "$out"
