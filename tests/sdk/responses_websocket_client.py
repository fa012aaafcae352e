"""The official `openai` SDK's Responses WebSocket mode (`client.responses.connect()`)
against Sluice, for `tests/e2e/responses_websocket.rs`.

Usage: responses_websocket_client.py BASE_URL KEY MODEL

On one socket it sends three `response.create` messages, each with only its new user
message and (after the first) `previous_response_id` of the one before, `store: false`.
Then it makes the first request again over HTTP (`client.responses.create(stream=True)`).
It prints one JSON line: {"turns": [{"types", "deltas", "text", "id", "status"}...],
"http": {"types", "deltas", "text"}}; errors are printed as the last event's JSON.
"""

import json
import sys

from openai import OpenAI

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
TURNS = ["first-turn question", "second-turn question", "third-turn question"]


def collect(events):
    """The event types, text deltas and final event of one response."""
    types, deltas, last = [], [], None
    for ev in events:
        types.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        last = ev
        if ev.type in TERMINAL:
            break
    return types, deltas, last


def main():
    base_url, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    client = OpenAI(base_url=base_url, api_key=key, max_retries=0)
    out = {"turns": []}
    with client.responses.connect() as conn:
        prev = None
        for text in TURNS:
            kwargs = {
                "model": model,
                "input": [{"role": "user", "content": text}],
                "store": False,
            }
            if prev is not None:
                kwargs["previous_response_id"] = prev
            conn.response.create(**kwargs)
            types, deltas, last = collect(conn)
            turn = {"types": types, "deltas": deltas}
            if last is not None and last.type == "response.completed":
                prev = last.response.id
                turn.update(text=last.response.output_text, id=prev, status=last.response.status)
            else:
                turn["error"] = last.to_dict() if last is not None else None
            out["turns"].append(turn)
    stream = client.responses.create(
        model=model,
        input=[{"role": "user", "content": TURNS[0]}],
        store=False,
        stream=True,
    )
    types, deltas, last = collect(stream)
    out["http"] = {
        "types": types,
        "deltas": deltas,
        "text": last.response.output_text if last is not None and last.type == "response.completed" else None,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
