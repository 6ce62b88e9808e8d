"""A small retail-support domain for `jsonlbatch rollout` (in the style of tau2-bench's retail).

Each conversation gets its own copy of the store's database (`new_state`); the write tool
(`refund_order`) changes it; `final_state` saves a hash of the database and what changed, the
score a benchmark compares. `ask_expert` asks a second model through the same run.

    jsonlbatch rollout examples/rollout/retail/tasks.jsonl -o conv.jsonl \\
        --tools examples/rollout/retail/tools.py --serve mock --server-arg=--tool-rate=0.6
"""

from __future__ import annotations

import copy
import hashlib
import json

import jsonlbatch

ORDERS = {
    "W1001": {"customer": "ana", "item": "kettle", "price": 39.0, "status": "delivered"},
    "W1002": {"customer": "ben", "item": "lamp", "price": 25.5, "status": "shipped"},
    "W1003": {"customer": "cho", "item": "chair", "price": 120.0, "status": "delivered"},
    "W1004": {"customer": "dev", "item": "desk", "price": 310.0, "status": "processing"},
}


def new_state(request_line: dict) -> dict:
    """A fresh database for each task: tools change this copy only."""
    return {"orders": copy.deepcopy(ORDERS), "refunds": []}


def get_order(order_id: str) -> dict:
    """Look an order up (a read tool)."""
    orders = jsonlbatch.current_conversation().state["orders"]
    if order_id not in orders:
        raise KeyError(f"no order {order_id}")  # the model sees the error and may try again
    return {"order_id": order_id, **orders[order_id]}


def refund_order(order_id: str, reason: str = "") -> str:
    """Refund a delivered order (a write tool: it changes the conversation's database)."""
    state = jsonlbatch.current_conversation().state
    order = state["orders"].get(order_id)
    if order is None:
        raise KeyError(f"no order {order_id}")
    if order["status"] != "delivered":
        return f"order {order_id} is {order['status']}: only delivered orders are refunded"
    order["status"] = "refunded"
    state["refunds"].append({"order_id": order_id, "amount": order["price"], "reason": reason})
    return f"refunded {order['price']:.2f} for {order_id}"


async def ask_expert(question: str) -> str:
    """Ask the policy expert (another model, routed by `model`) through the same run."""
    conversation = jsonlbatch.current_conversation()
    answer = await conversation.ask(
        {
            "model": "mock",
            "max_tokens": 12,
            "messages": [
                {"role": "system", "content": "You know the store's refund policy."},
                {"role": "user", "content": question},
            ],
        }
    )
    return answer.text


def final_state(state: dict) -> dict:
    """What the task's score compares: the database's hash and the refunds made."""
    text = json.dumps(state["orders"], sort_keys=True).encode()
    return {"db_hash": hashlib.sha256(text).hexdigest()[:16], "refunds": state["refunds"]}
