# Sourced by the bench scripts: `bench_binary NAME` builds the bench target NAME (release) and
# prints the path of its executable.
bench_binary() {
  cargo bench --bench "$1" --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json, sys
name = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == name and m.get("executable"):
        print(m["executable"])' "$1"
}
