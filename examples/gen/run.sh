#!/usr/bin/env bash
# End to end on the built-in mock server: data + template -> requests -> responses.
# Run from anywhere:  bash examples/gen/run.sh   (needs `pip install -e .` first)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/../../out/gen-example}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"  # shown in messages: no `examples/gen/../../` in the paths

# 1. Agentless-style: 4 samples per problem, sample 0 greedy, the others at temperature 0.8.
jsonlbatch gen --data "$here/problems.jsonl" --template "$here/prompt.j2" \
    --system "You are a careful math tutor." --id "{{ id }}" \
    --model mock --samples 4 --greedy-first --temperature 0.8 --seed 1 --max-tokens 256 \
    --no-think --force -o "$out/requests.jsonl"

# 2. A few-shot chat from a messages template, only the harder problems, 3 choices per call.
jsonlbatch gen --data "$here/problems.jsonl" --messages "$here/chat.j2" --id "{{ id }}" \
    --where "level != 'easy'" --model mock --n 3 --temperature 0.6 --force \
    -o "$out/fewshot-requests.jsonl"

# 3. The Python API.
python "$here/pipeline.py" "$out/pipeline-requests.jsonl"

# 4. Send them to the built-in mock server: one response line per request.
for name in requests fewshot-requests pipeline-requests; do
    jsonlbatch exec "$out/$name.jsonl" -o "$out/${name/requests/responses}.jsonl" --serve mock -q
    echo "$out/${name/requests/responses}.jsonl: $(wc -l < "$out/${name/requests/responses}.jsonl") responses"
done
