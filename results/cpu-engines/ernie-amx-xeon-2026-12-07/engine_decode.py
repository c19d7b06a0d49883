"""The engine's own decode pace per run, from llama-server's log (its per-request `eval time` lines): the random-weight
ERNIE's tokens carry almost no text, so the client's per-reply pace and first text are empty or late, and the level's
total tok/s includes the prompts. Replies of 100+ tokens only (the warm-up and the answer check's are shorter); the
first 32 are the 1-user level, the next 32 the 8-user level.

usage: python engine_decode.py OUT_JSON NAME=ENGINE_LOG ... (one per run, in the order they ran)"""

import json
import re
import statistics
import sys

EVAL = re.compile(r"\s+eval time =\s+([\d.]+) ms /\s+(\d+) tokens")


def paces(path: str) -> list[float]:
    out = []
    with open(path) as f:
        for line in f:
            m = EVAL.search(line)
            if m and int(m.group(2)) >= 100:
                out.append(int(m.group(2)) / (float(m.group(1)) / 1000))
    return out


def main() -> None:
    result = {}
    for arg in sys.argv[2:]:
        name, path = arg.split("=", 1)
        p = paces(path)
        result[name] = {
            "replies": len(p),
            "one_user_tok_s_median": round(statistics.median(p[:32]), 1),
            "eight_users_tok_s_per_reply_median": round(statistics.median(p[32:64]), 1) if len(p) > 32 else None,
        }
        print(name, result[name])
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)


main()
