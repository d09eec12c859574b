"""Recorded agentic sessions for the bundled default model: a deterministic generator.

Contract: `generate(domain, seed, count)` returns `count` sessions in the canonical JSONL form
(SESSIONS.md: `{"id", "messages", "tools", "meta"}`, OpenAI chat messages, assistant
`tool_calls` with JSON-string `arguments`, `tool` results carrying `tool_call_id`,
`reasoning_content` on some assistant turns). Session i depends only on (domain, seed, i):
the same seed gives the same bytes, on any machine, in any process (no `hash()`, no clock).

Two agents:
  - support: a retail customer-support agent with order tools (look up a customer or an
    order, read a policy, cancel, refund, exchange, change the address, track a parcel),
    asking for an explicit yes before any change, several user messages per session;
  - coding: a coding agent with read_file / edit_file / run_tests / bash, fixing a real
    one-line bug in a small Python module (the test output is what the buggy code really
    returns: the functions are executed here), then adding a regression test, running the
    suite or committing.

Names, ids, amounts, dates, paths, functions and phrasings are drawn from pools, so values
must be read from the context (an order id from the user, a refund amount from a tool
result, a line of code from a file) rather than memorised.

Usage:
    python scripts/generate_sessions.py demo             # sessions/support.jsonl, sessions/coding.jsonl
    python scripts/generate_sessions.py train -o data/train.jsonl [--count 800]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

# Seeds of the two splits: the demo sessions in sessions/ are held out from training.
TRAIN_SEED = 1
DEMO_SEED = 2
DEMO_COUNTS = {"support": 3, "coding": 4}
DOMAINS = ("support", "coding")


def session_rng(domain: str, seed: int, index: int) -> random.Random:
    """One generator per session: string seeds are hashed with SHA-512, stable across processes."""
    return random.Random(f"{domain}/{seed}/{index}")


def call_id(rng: random.Random) -> str:
    return "call_" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))


def tool_schema(name: str, description: str, params: dict[str, tuple[str, str]], required: list[str] | None = None) -> dict:
    """params: name -> (json type, description)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": t, "description": d} for k, (t, d) in params.items()},
                "required": list(params) if required is None else required,
            },
        },
    }


class Transcript:
    """Builds one session's messages; tool calls and their results are paired by id."""

    def __init__(self, rng: random.Random, system: str):
        self.rng = rng
        self.messages: list[dict] = [{"role": "system", "content": system}]

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def say(self, text: str, reasoning: str | None = None) -> None:
        msg = {"role": "assistant", "content": text}
        if reasoning:
            msg["reasoning_content"] = reasoning
        self.messages.append(msg)

    def call(self, name: str, arguments: dict, result, reasoning: str | None = None, text: str | None = None) -> None:
        """One assistant turn with one tool call, then the tool's result (JSON-encoded when not a string)."""
        cid = call_id(self.rng)
        msg = {
            "role": "assistant",
            "content": text,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}],
        }
        if reasoning:
            msg["reasoning_content"] = reasoning
        self.messages.append(msg)
        content = result if isinstance(result, str) else json.dumps(result)
        self.messages.append({"role": "tool", "tool_call_id": cid, "content": content})


def maybe(rng: random.Random, p: float, text: str) -> str | None:
    return text if rng.random() < p else None


# =============================================================================================
# Support agent


COMPANIES = ["Northwind Outfitters", "Bluebird Home", "Crescent Electronics", "Maple & Pine", "Harbor Goods", "Summit Supply Co."]
FIRST = ["Ava", "Liam", "Noah", "Emma", "Olivia", "Mia", "Lucas", "Sofia", "Ethan", "Chloe", "Mateo", "Aisha", "Yuki",
         "Omar", "Grace", "Daniel", "Priya", "Leo", "Hannah", "Ivan", "Zoe", "Samuel", "Nora", "Kenji", "Fatima", "Elena",
         "Marcus", "Julia", "Tariq", "Ingrid", "Diego", "Amara", "Felix", "Rosa", "Victor", "Layla"]
LAST = ["Garcia", "Smith", "Nguyen", "Kim", "Patel", "Johnson", "Muller", "Rossi", "Silva", "Kowalski", "Brown", "Lopez",
        "Tanaka", "Hassan", "Davis", "Martin", "Clark", "Lewis", "Young", "Walker", "Hughes", "Novak", "Ortiz", "Reyes",
        "Fischer", "Larsen", "Moreau", "Bennett", "Okafor", "Sato"]
EMAIL_DOMAINS = ["example.com", "mail.com", "inbox.org", "post.net"]
CATALOG = [  # (name, category, low price, high price, sizes)
    ("Rain Jacket", "apparel", 60, 140, ["S", "M", "L", "XL"]),
    ("Wool Sweater", "apparel", 45, 110, ["S", "M", "L", "XL"]),
    ("Running Shoes", "apparel", 70, 160, ["8", "9", "10", "11"]),
    ("Hiking Boots", "apparel", 90, 210, ["8", "9", "10", "11", "12"]),
    ("Cotton T-Shirt", "apparel", 12, 35, ["S", "M", "L"]),
    ("Denim Jeans", "apparel", 40, 95, ["30", "32", "34", "36"]),
    ("Wireless Earbuds", "electronics", 40, 180, None),
    ("USB-C Charger", "electronics", 15, 55, None),
    ("Mechanical Keyboard", "electronics", 60, 190, None),
    ("Smart Watch", "electronics", 120, 380, None),
    ("Bluetooth Speaker", "electronics", 35, 150, None),
    ("Desk Lamp", "home", 20, 80, None),
    ("Ceramic Mug Set", "home", 18, 45, None),
    ("Throw Blanket", "home", 25, 90, None),
    ("Water Bottle", "home", 12, 40, None),
    ("Chef Knife", "home", 30, 140, None),
]
STREETS = ["Oak Street", "Maple Avenue", "Pine Road", "Cedar Lane", "Elm Drive", "Lakeview Boulevard", "Hill Street",
           "River Road", "Park Avenue", "Sunset Drive"]
CITIES = [("Portland", "OR", "97"), ("Austin", "TX", "78"), ("Denver", "CO", "80"), ("Columbus", "OH", "43"),
          ("Raleigh", "NC", "27"), ("Madison", "WI", "53"), ("Boise", "ID", "83"), ("Tucson", "AZ", "85"),
          ("Albany", "NY", "12"), ("Savannah", "GA", "31")]
CARRIERS = ["UPS", "FedEx", "USPS", "DHL"]
PAYMENTS = ["Visa ending in {d}", "Mastercard ending in {d}", "PayPal account", "gift card", "Amex ending in {d}"]
RETURN_WINDOW = 30
REFUND_DAYS = "5-7 business days"

SUPPORT_POLICY = (
    "Policy:\n"
    "- Look the order up before acting on it; never guess an order id.\n"
    "- Cancel or change the address only while an order is pending or processing.\n"
    f"- Delivered items can be returned (refund) or apparel exchanged within {RETURN_WINDOW} days of delivery.\n"
    "- Before any change, say what you will do and get an explicit yes.\n"
    "- Be concise and friendly."
)

SUPPORT_TOOLS = [
    tool_schema("find_customer", "Find a customer and their orders by email.", {"email": ("string", "Email address.")}),
    tool_schema("get_order", "Get an order's details and status.", {"order_id": ("string", "Order id, e.g. W1234567.")}),
    tool_schema("get_policy", "Read the store policy on a topic.", {"topic": ("string", "returns, cancellations or exchanges.")}),
    tool_schema("cancel_order", "Cancel a pending or processing order.",
                {"order_id": ("string", "Order id."), "reason": ("string", "Why the customer cancels.")}),
    tool_schema("refund_items", "Refund delivered items.",
                {"order_id": ("string", "Order id."), "item_ids": ("array", "Items to refund."), "reason": ("string", "Why.")}),
    tool_schema("exchange_item", "Exchange an apparel item for another size.",
                {"order_id": ("string", "Order id."), "item_id": ("string", "Item id."), "new_size": ("string", "New size.")}),
    tool_schema("update_address", "Change the address of a pending or processing order.",
                {"order_id": ("string", "Order id."), "address": ("string", "Full new address.")}),
    tool_schema("track_package", "Track a shipped package.", {"tracking_number": ("string", "Tracking number.")}),
]

POLICY_TEXT = {
    "returns": f"Delivered items can be returned within {RETURN_WINDOW} days of delivery. Refunds go to the original "
               f"payment method and arrive in {REFUND_DAYS}.",
    "cancellations": "Orders can be cancelled while their status is pending or processing. Shipped orders cannot be "
                     "cancelled; they can be returned after delivery.",
    "exchanges": f"Apparel can be exchanged for another size within {RETURN_WINDOW} days of delivery. The new item ships "
                 "for free once the original is scanned by the carrier.",
}

# The customer's reasons, and the reason the agent records for them.
CANCEL_REASONS = [("I ordered it by mistake", "ordered by mistake"), ("I found it cheaper elsewhere", "found a better price"),
                  ("I don't need it anymore", "no longer needed"), ("it's taking too long to ship", "shipping too slow")]
RETURN_REASONS = [("it doesn't fit", "does not fit"), ("it arrived damaged", "arrived damaged"),
                  ("it's not what I expected", "not as expected"), ("it stopped working", "defective")]


class Customer:
    def __init__(self, rng: random.Random):
        self.first, self.last = rng.choice(FIRST), rng.choice(LAST)
        self.name = f"{self.first} {self.last}"
        self.email = f"{self.first.lower()}.{self.last.lower()}{rng.randint(1, 99)}@{rng.choice(EMAIL_DOMAINS)}"
        self.customer_id = f"C{rng.randint(10000, 99999)}"


def address(rng: random.Random) -> str:
    city, state, zip2 = rng.choice(CITIES)
    return f"{rng.randint(10, 9999)} {rng.choice(STREETS)}, {city}, {state} {zip2}{rng.randint(100, 999)}"


def date(rng: random.Random, day_of_year: int) -> str:
    month_days = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    m = 0
    while day_of_year > month_days[m]:
        day_of_year -= month_days[m]
        m += 1
    return f"2025-{m + 1:02d}-{day_of_year:02d}"


def make_order(rng: random.Random, customer: Customer, status: str, *, apparel: bool = False) -> dict:
    """An order as get_order returns it. status: pending | processing | shipped | delivered."""
    pool = [c for c in CATALOG if c[1] == "apparel"] if apparel else CATALOG
    n_items = 1 if apparel else rng.choice([1, 1, 2])
    items = []
    for product in rng.sample(pool, n_items):
        name, category, lo, hi, sizes = product
        item = {"item_id": f"I{rng.randint(100000, 999999)}", "name": name,
                "price": round(rng.randint(lo * 100, hi * 100) / 100, 2)}
        if sizes:
            item["size"] = rng.choice(sizes)
        items.append(item)
    placed = rng.randint(20, 300)
    order = {"order_id": f"W{rng.randint(1000000, 9999999)}", "customer": customer.name, "status": status,
             "items": items, "total": round(sum(i["price"] for i in items), 2),
             "payment": rng.choice(PAYMENTS).format(d=rng.randint(1000, 9999)),
             "placed_on": date(rng, placed), "ship_to": address(rng)}
    if status in ("shipped", "delivered"):
        order["carrier"] = rng.choice(CARRIERS)
        order["tracking_number"] = f"{rng.choice(['1Z', 'TRK', 'PKG'])}{rng.randint(10 ** 9, 10 ** 10 - 1)}"
    if status == "delivered":
        days = rng.choice([rng.randint(2, RETURN_WINDOW), rng.randint(2, RETURN_WINDOW), rng.randint(RETURN_WINDOW + 1, 75)])
        order["delivered_on"] = date(rng, min(placed + 4, 360))
        order["days_since_delivery"] = days
    return order


def money(x: float) -> str:
    return f"${x:.2f}"


def item_list(items: list[dict]) -> str:
    names = [f"{i['name']} (size {i['size']})" if "size" in i else i["name"] for i in items]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


GREETINGS = ["Hi", "Hello", "Hey there", "Good morning", "Hi there", "Hello,"]
THANKS = ["Thanks!", "Thank you so much.", "Great, thanks.", "Perfect, thank you!", "Awesome, thanks a lot."]
YES = ["Yes, please go ahead.", "Yes, do it.", "Yes please.", "That's right, go ahead.", "Yes, that's correct.", "Sure, go ahead."]
CLOSERS = ["That's all, thanks!", "No, that's everything. Thank you!", "Nope, that's it. Have a good day.",
           "All good now, thanks for the help."]
ANYTHING_ELSE = ["Is there anything else I can help you with?", "Can I help with anything else?",
                 "Anything else I can do for you today?"]


def support_session(rng: random.Random) -> Transcript:
    company = rng.choice(COMPANIES)
    system = (f"You are the customer support agent of {company}, an online store. "
              f"Help customers with their orders using the tools.\n\n{SUPPORT_POLICY}")
    t = Transcript(rng, system)
    customer = Customer(rng)
    intents = ["cancel", "refund", "exchange", "address", "track"]
    first = rng.choice(intents)
    plan = [first]
    if rng.random() < 0.5:
        plan.append(rng.choice([i for i in intents if i != first]))
    for n, intent in enumerate(plan):
        support_intent(t, rng, customer, intent, first=(n == 0))
    t.user(rng.choice(CLOSERS))
    t.say(rng.choice([f"You're welcome, {customer.first}! Have a great day.",
                      f"Happy to help, {customer.first}. Take care!",
                      f"Glad I could help, {customer.first}. Have a nice day!"]))
    return t


def intent_order(rng: random.Random, customer: Customer, intent: str) -> dict:
    if intent in ("cancel", "address"):
        status = rng.choice(["pending", "processing", "processing", "shipped"])  # shipped: refused
        return make_order(rng, customer, status)
    if intent == "track":
        return make_order(rng, customer, "shipped")
    return make_order(rng, customer, "delivered", apparel=(intent == "exchange"))


def support_intent(t: Transcript, rng: random.Random, customer: Customer, intent: str, first: bool) -> None:
    order = intent_order(rng, customer, intent)
    oid = order["order_id"]
    item = order["items"][0]
    greet = rng.choice(GREETINGS) + " " if first else ""
    ask = {
        "cancel": ["I'd like to cancel my order", "I need to cancel an order", "please cancel my order"],
        "refund": ["I want to return something from my order", "I'd like a refund for my order", "can I return my order"],
        "exchange": ["I need a different size for an item in my order", "can I exchange the size on my order",
                     f"the {item['name'].lower()} from my order doesn't fit, I need another size"],
        "address": ["I need to change the shipping address on my order", "can you update the delivery address for my order",
                    "I moved, please change the address on my order"],
        "track": ["where is my order", "can you tell me where my package is", "my order hasn't arrived yet, can you check it"],
    }[intent]
    request = rng.choice(ask)
    request = request if first else request[0].upper() + request[1:]
    by_email = first and rng.random() < 0.35  # the customer gives an email, not an order id
    if by_email:
        t.user(f"{greet}{request}. My email is {customer.email}. It's the one with the {item['name'].lower()}.")
        others = [make_order(rng, customer, rng.choice(["delivered", "shipped", "processing"])) for _ in range(rng.randint(0, 2))]
        listing = others + [order]
        rng.shuffle(listing)
        t.call("find_customer", {"email": customer.email},
               {"customer_id": customer.customer_id, "name": customer.name, "email": customer.email,
                "orders": [{"order_id": o["order_id"], "placed_on": o["placed_on"], "items": [i["name"] for i in o["items"]]}
                           for o in listing]},
               reasoning=maybe(rng, 0.6, f"The customer gave their email, {customer.email}, instead of an order id. "
                                         "I'll look up their orders first."))
        t.call("get_order", {"order_id": oid}, order,
               reasoning=maybe(rng, 0.6, f"The order with the {item['name'].lower()} is {oid}. Let me get its details."))
    else:
        hash_ = rng.choice(["#", ""])
        t.user(f"{greet}{request}. The order number is {hash_}{oid}." if rng.random() < 0.5
               else f"{greet}{request} {hash_}{oid}.")
        t.call("get_order", {"order_id": oid}, order,
               reasoning=maybe(rng, 0.6, f"The customer wants help with order {oid}. I need to check its details first."),
               text=maybe(rng, 0.3, "Let me look that up for you."))

    status = order["status"]
    reasoning_on = rng.random() < 0.6
    if intent == "cancel":
        if status == "shipped":
            t.say(f"I'm sorry, order {oid} has already shipped with {order['carrier']}, so it can no longer be cancelled. "
                  "Once it's delivered you can return it for a refund. " + rng.choice(ANYTHING_ELSE),
                  reasoning=f"Order {oid} is shipped. Shipped orders cannot be cancelled." if reasoning_on else None)
            return
        said, reason = rng.choice(CANCEL_REASONS)
        t.say(f"I found order {oid} with the {item_list(order['items'])}, total {money(order['total'])}. It is still "
              f"{status}, so I can cancel it. Could you tell me why you'd like to cancel?",
              reasoning=f"Order {oid} is {status}, so it can be cancelled. I need the reason and a confirmation." if reasoning_on else None)
        t.user(f"{said.capitalize()}. Please cancel it.")
        t.call("cancel_order", {"order_id": oid, "reason": reason},
               {"order_id": oid, "status": "cancelled", "refund": {"amount": order["total"], "method": order["payment"]}},
               reasoning=maybe(rng, 0.5, f"The customer confirmed and said {said}. I'll cancel order {oid} with reason "
                                         f"'{reason}'."))
        t.say(f"Done! Order {oid} has been cancelled. A refund of {money(order['total'])} will go back to your "
              f"{order['payment']} within {REFUND_DAYS}. {rng.choice(ANYTHING_ELSE)}")
    elif intent == "refund":
        if rng.random() < 0.5:
            t.call("get_policy", {"topic": "returns"}, POLICY_TEXT["returns"],
                   reasoning=maybe(rng, 0.7, f"Order {oid} was delivered {order['days_since_delivery']} days ago. "
                                             "Let me check the return policy."))
        days = order["days_since_delivery"]
        if days > RETURN_WINDOW:
            t.say(f"I'm sorry, order {oid} was delivered {days} days ago, which is past our {RETURN_WINDOW}-day return "
                  "window, so I can't process a refund for it. " + rng.choice(ANYTHING_ELSE),
                  reasoning=f"{days} days is more than the {RETURN_WINDOW}-day window, so the return is not allowed." if reasoning_on else None)
            return
        said, reason = rng.choice(RETURN_REASONS)
        refunded = order["items"]
        amount = round(sum(i["price"] for i in refunded), 2)
        t.say(f"Order {oid} was delivered {days} days ago, so it's within the {RETURN_WINDOW}-day return window. I can "
              f"refund the {item_list(refunded)} for {money(amount)} to your {order['payment']}. What's the reason for the "
              "return, and shall I go ahead?",
              reasoning=f"{days} days is within the {RETURN_WINDOW}-day window. I need a reason and a confirmation." if reasoning_on else None)
        t.user(f"{said.capitalize()}. {rng.choice(YES)}")
        refund_id = f"R{rng.randint(100000, 999999)}"
        t.call("refund_items", {"order_id": oid, "item_ids": [i["item_id"] for i in refunded], "reason": reason},
               {"refund_id": refund_id, "order_id": oid, "amount": amount, "method": order["payment"], "status": "approved"},
               reasoning=maybe(rng, 0.5, f"The customer confirmed. Refunding {len(refunded)} item(s) from order {oid}."))
        t.say(f"Your refund {refund_id} of {money(amount)} has been approved and will reach your {order['payment']} within "
              f"{REFUND_DAYS}. {rng.choice(ANYTHING_ELSE)}")
    elif intent == "exchange":
        days = order["days_since_delivery"]
        if days > RETURN_WINDOW:
            t.say(f"I'm sorry, order {oid} was delivered {days} days ago, past the {RETURN_WINDOW}-day exchange window, "
                  "so I can't exchange the item. " + rng.choice(ANYTHING_ELSE),
                  reasoning=f"{days} days is more than {RETURN_WINDOW}, so no exchange is possible." if reasoning_on else None)
            return
        sizes = next(c[4] for c in CATALOG if c[0] == item["name"])
        new_size = rng.choice([s for s in sizes if s != item["size"]])
        t.say(f"I see the {item['name']} in size {item['size']} on order {oid}. Which size would you like instead?",
              reasoning=f"Order {oid} was delivered {days} days ago, within the window. I need the new size." if reasoning_on else None)
        t.user(f"Size {new_size}, please.")
        t.say(f"To confirm: I'll exchange the {item['name']} (item {item['item_id']}) on order {oid} from size {item['size']} "
              f"to size {new_size}. Shall I proceed?")
        t.user(rng.choice(YES))
        t.call("exchange_item", {"order_id": oid, "item_id": item["item_id"], "new_size": new_size},
               {"order_id": oid, "item_id": item["item_id"], "new_size": new_size, "status": "exchange created",
                "return_label": f"https://returns.example.com/{oid.lower()}"},
               reasoning=maybe(rng, 0.5, f"Confirmed. Exchanging item {item['item_id']} to size {new_size}."))
        t.say(f"The exchange is set up. Please use the return label at https://returns.example.com/{oid.lower()} to send back "
              f"the size {item['size']}; the size {new_size} ships as soon as the carrier scans it. {rng.choice(ANYTHING_ELSE)}")
    elif intent == "address":
        if status == "shipped":
            t.say(f"I'm sorry, order {oid} has already shipped, so its address can't be changed anymore. You can track it "
                  f"with {order['carrier']} using {order['tracking_number']}. " + rng.choice(ANYTHING_ELSE),
                  reasoning=f"Order {oid} is shipped; the address can only change while pending or processing." if reasoning_on else None)
            return
        t.say(f"Order {oid} is still {status}, so I can change the address. It is currently going to {order['ship_to']}. "
              "What is the new address?",
              reasoning=f"Order {oid} is {status}, so the address can be changed. I need the new address." if reasoning_on else None)
        new = address(rng)
        t.user(f"Please send it to {new}.")
        t.say(f"To confirm: I'll change the shipping address of order {oid} to {new}. Shall I go ahead?")
        t.user(rng.choice(YES))
        t.call("update_address", {"order_id": oid, "address": new},
               {"order_id": oid, "ship_to": new, "status": status},
               reasoning=maybe(rng, 0.5, f"Confirmed. Updating the address of order {oid}."))
        t.say(f"Done! Order {oid} will now be shipped to {new}. {rng.choice(ANYTHING_ELSE)}")
    elif intent == "track":
        eta = date(rng, rng.randint(40, 330))
        city, state, _ = rng.choice(CITIES)
        event = rng.choice(["In transit", "Arrived at facility", "Out for delivery", "Departed facility"])
        t.call("track_package", {"tracking_number": order["tracking_number"]},
               {"tracking_number": order["tracking_number"], "carrier": order["carrier"], "status": event,
                "last_location": f"{city}, {state}", "estimated_delivery": eta},
               reasoning=maybe(rng, 0.6, f"Order {oid} has shipped with {order['carrier']}. I'll track "
                                         f"{order['tracking_number']}."))
        t.say(f"Your order {oid} is with {order['carrier']}: {event.lower()}, last seen in {city}, {state}. It should "
              f"arrive by {eta}. {rng.choice(ANYTHING_ELSE)}")


# =============================================================================================
# Coding agent


REPOS = ["acme/billing-service", "tinytools/textkit", "orbit/scheduler", "lumen/cli-utils", "harbor/data-pipeline",
         "quill/notes-app", "pixel/image-tools", "atlas/geo-kit", "nimbus/weather-api", "forge/build-helpers"]
MODULES = ["utils", "helpers", "core", "text", "numbers", "paths", "config", "common", "formatting", "validation"]

# Each function: its correct source, the one line a bug changes, its tests (expressions whose
# expected values come from running the correct code), and how the agent explains the fix.
FUNCTIONS = [
    dict(name="mean", src=["def mean(values):", "    if not values:", "        return 0.0", "    return sum(values) / len(values)"],
         bug=("    return sum(values) / len(values)", "    return sum(values) // len(values)"),
         tests=[("basic", "mean([1, 2, 4])"), ("empty", "mean([])")], regression="mean([1, 2])",
         why="uses floor division `//`, which truncates the result", fix="use true division `/`"),
    dict(name="clamp", src=["def clamp(value, low, high):", "    return max(low, min(value, high))"],
         bug=("    return max(low, min(value, high))", "    return min(low, max(value, high))"),
         tests=[("inside", "clamp(5, 0, 10)"), ("below", "clamp(-3, 0, 10)")], regression="clamp(42, 0, 10)",
         why="swaps `min` and `max`, so it returns the lower bound for values inside the range", fix="take `max(low, min(value, high))`"),
    dict(name="chunk", src=["def chunk(items, size):", "    return [items[i:i + size] for i in range(0, len(items), size)]"],
         bug=("    return [items[i:i + size] for i in range(0, len(items), size)]",
              "    return [items[i:i + size] for i in range(0, len(items) - size, size)]"),
         tests=[("uneven", "chunk([1, 2, 3, 4, 5], 2)"), ("empty", "chunk([], 3)")], regression="chunk([1, 2, 3], 3)",
         why="stops the range at `len(items) - size`, so the last chunk is dropped", fix="iterate over `range(0, len(items), size)`"),
    dict(name="slugify", src=["def slugify(text):", '    return "-".join(text.lower().split())'],
         bug=('    return "-".join(text.lower().split())', '    return "-".join(text.split())'),
         tests=[("words", 'slugify("Hello World")'), ("spaces", 'slugify("  many   spaces  ")')], regression='slugify("ABC Def")',
         why="never lowercases the text", fix="call `text.lower()` before splitting"),
    dict(name="percent", src=["def percent(part, total):", "    if total == 0:", "        return 0.0", "    return round(100 * part / total, 1)"],
         bug=("    return round(100 * part / total, 1)", "    return round(part / total, 1)"),
         tests=[("quarter", "percent(1, 4)"), ("zero_total", "percent(0, 0)")], regression="percent(3, 4)",
         why="returns the fraction instead of the percentage", fix="multiply by 100 before rounding"),
    dict(name="last_n", src=["def last_n(items, n):", "    if n <= 0:", "        return []", "    return items[-n:]"],
         bug=("    if n <= 0:", "    if n < 0:"),
         tests=[("two", "last_n([1, 2, 3], 2)"), ("zero", "last_n([1, 2, 3], 0)")], regression="last_n([4, 5], 0)",
         why="lets `n == 0` through, and `items[-0:]` is the whole list", fix="return an empty list when `n <= 0`"),
    dict(name="count_words", src=["def count_words(text):", "    return len(text.split())"],
         bug=("    return len(text.split())", '    return len(text.split(" "))'),
         tests=[("simple", 'count_words("one two three")'), ("padded", 'count_words("  padded   text ")')],
         regression='count_words(" a  b ")',
         why='splits on single spaces, so repeated spaces produce empty words', fix="use `text.split()` with no separator"),
    dict(name="merge_settings", src=["def merge_settings(defaults, overrides):", "    merged = dict(defaults)",
                                     "    merged.update(overrides)", "    return merged"],
         bug=("    merged.update(overrides)", "    merged.update(defaults)"),
         tests=[("override", 'merge_settings({"a": 1, "b": 2}, {"b": 3})'), ("new_key", 'merge_settings({}, {"x": 1})')],
         regression='merge_settings({"debug": False}, {"debug": True})',
         why="updates the copy with `defaults` again, so the overrides are ignored", fix="update it with `overrides`"),
    dict(name="normalize_path", src=["def normalize_path(path):", '    return path.rstrip("/") or "/"'],
         bug=('    return path.rstrip("/") or "/"', '    return path.rstrip("/")'),
         tests=[("trailing", 'normalize_path("/usr/local/")'), ("root", 'normalize_path("/")')], regression='normalize_path("//")',
         why='strips the root path `"/"` down to an empty string', fix='fall back to `"/"` when nothing is left'),
    dict(name="retry_delays", src=["def retry_delays(attempts, base):", "    return [base * 2 ** i for i in range(attempts)]"],
         bug=("    return [base * 2 ** i for i in range(attempts)]", "    return [base * 2 ** i for i in range(1, attempts)]"),
         tests=[("three", "retry_delays(3, 1.0)"), ("none", "retry_delays(0, 0.5)")], regression="retry_delays(1, 2.0)",
         why="starts the range at 1, so the first delay is skipped", fix="iterate over `range(attempts)`"),
    dict(name="is_valid_port", src=["def is_valid_port(value):", "    return 0 < value < 65536"],
         bug=("    return 0 < value < 65536", "    return 0 < value <= 65536"),
         tests=[("http", "is_valid_port(8080)"), ("too_big", "is_valid_port(65536)")], regression="is_valid_port(2 ** 16)",
         why="accepts 65536, one past the largest port", fix="compare with `< 65536`"),
    dict(name="truncate", src=["def truncate(text, limit):", "    if len(text) <= limit:", "        return text",
                               '    return text[: limit - 3] + "..."'],
         bug=('    return text[: limit - 3] + "..."', '    return text[:limit] + "..."'),
         tests=[("short", 'truncate("hello", 10)'), ("long", 'truncate("abcdefghij", 8)')], regression='truncate("abcdef", 5)',
         why="keeps `limit` characters before adding the ellipsis, so the result is too long",
         fix="keep `limit - 3` characters"),
    dict(name="parse_bool", src=["def parse_bool(value):", '    return value.strip().lower() in ("1", "true", "yes", "on")'],
         bug=('    return value.strip().lower() in ("1", "true", "yes", "on")', '    return value.lower() in ("1", "true", "yes", "on")'),
         tests=[("upper", 'parse_bool("TRUE")'), ("padded", 'parse_bool(" yes ")')], regression='parse_bool(" on")',
         why="does not strip surrounding whitespace", fix="call `value.strip()` first"),
    dict(name="unique", src=["def unique(items):", "    seen = set()", "    result = []", "    for item in items:",
                             "        if item not in seen:", "            seen.add(item)", "            result.append(item)",
                             "    return result"],
         bug=("        if item not in seen:", "        if item in seen:"),
         tests=[("order", "unique([3, 1, 3, 2, 1])"), ("empty", "unique([])")], regression="unique([1, 1])",
         why="inverts the membership test, so nothing is ever added", fix="keep items that are `not in seen`"),
]

CODING_SYSTEM = (
    "You are a coding agent working in the repository {repo}. You can read and edit files, run the tests and run "
    "shell commands with the tools.\n\n"
    "Guidelines:\n"
    "- Reproduce a failure before changing code.\n"
    "- Make the smallest change that fixes the problem, then run the tests again.\n"
    "- Summarise what you changed in one or two sentences."
)

CODING_TOOLS = [
    tool_schema("read_file", "Read a file of the repository.", {"path": ("string", "Path relative to the repository root.")}),
    tool_schema("edit_file", "Replace one exact occurrence of old_str with new_str in a file.",
                {"path": ("string", "Path relative to the repository root."), "old_str": ("string", "The exact text to replace."),
                 "new_str": ("string", "The replacement text.")}),
    tool_schema("run_tests", "Run pytest on a test file or directory.", {"path": ("string", "The test file or directory.")}),
    tool_schema("bash", "Run a shell command in the repository root.", {"command": ("string", "The command to run.")}),
]


def evaluate(src_lines: list[str], expr: str):
    """Run a function's source and evaluate one call: the value a test really sees."""
    scope: dict = {}
    exec("\n".join(src_lines), scope)  # our own fixed snippets above, nothing external
    return eval(expr, scope)


def buggy(fn: dict) -> list[str]:
    old, new = fn["bug"]
    assert old in fn["src"], fn["name"]
    return [new if line == old else line for line in fn["src"]]


def _check_functions() -> None:
    """Every bug must fail at least one of its function's tests, and the regression test."""
    for fn in FUNCTIONS:
        fails = [evaluate(fn["src"], e) != evaluate(buggy(fn), e) for _, e in fn["tests"]]
        assert any(fails), f"{fn['name']}: the bug fails none of its tests"
        assert evaluate(fn["src"], fn["regression"]) != evaluate(buggy(fn), fn["regression"]), fn["name"]


_check_functions()


class Repo:
    """A module with one buggy function among correct ones, and its test file."""

    def __init__(self, rng: random.Random):
        self.repo = rng.choice(REPOS)
        self.package = self.repo.split("/")[1].replace("-", "_")
        self.module = rng.choice(MODULES)
        self.src_path = f"src/{self.package}/{self.module}.py"
        self.test_path = f"tests/test_{self.module}.py"
        picked = rng.sample(FUNCTIONS, rng.randint(2, 3))
        self.bug_fn = picked[0]
        rng.shuffle(picked)
        self.functions = picked
        self.fixed = False
        self.regression_added = False

    def source(self) -> str:
        blocks = ["\n".join(fn["src"] if (fn is not self.bug_fn or self.fixed) else buggy(fn)) for fn in self.functions]
        return '"""Small helpers."""\n\n\n' + "\n\n\n".join(blocks) + "\n"

    def tests(self) -> list[tuple[str, str, object]]:
        """(test name, expression, expected value) in file order."""
        out = [(f"test_{fn['name']}_{label}", expr, evaluate(fn["src"], expr)) for fn in self.functions for label, expr in fn["tests"]]
        if self.regression_added:
            fn = self.bug_fn
            out.append((f"test_{fn['name']}_regression", fn["regression"], evaluate(fn["src"], fn["regression"])))
        return out

    def test_source(self) -> str:
        names = ", ".join(fn["name"] for fn in self.functions)
        body = [f"from {self.package}.{self.module} import {names}"]
        for name, expr, expected in self.tests():
            body.append(f"def {name}():\n    assert {expr} == {expected!r}")
        return "\n\n\n".join(body) + "\n"

    def current(self, fn: dict) -> list[str]:
        return fn["src"] if (fn is not self.bug_fn or self.fixed) else buggy(fn)

    def pytest_output(self) -> tuple[str, int, int]:
        """What `pytest -q <test file>` prints, from really evaluating the current code."""
        lines = self.test_source().split("\n")
        results, failures = [], []
        fn_of = {f"test_{fn['name']}_{label}": fn for fn in self.functions for label, _ in fn["tests"]}
        if self.regression_added:
            fn_of[f"test_{self.bug_fn['name']}_regression"] = self.bug_fn
        for name, expr, expected in self.tests():
            got = evaluate(self.current(fn_of[name]), expr)
            ok = got == expected
            results.append("." if ok else "F")
            if not ok:
                lineno = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}(")) + 2
                failures.append((name, expr, expected, got, lineno))
        dots = "".join(results)
        out = [f"{dots:<72} [100%]"]
        passed, failed = dots.count("."), dots.count("F")
        if failures:
            out.append("=" * 31 + " FAILURES " + "=" * 31)
            for name, expr, expected, got, lineno in failures:
                out += [f"{'_' * 20} {name} {'_' * 20}", "", f"    def {name}():",
                        f">       assert {expr} == {expected!r}", f"E       assert {got!r} == {expected!r}",
                        f"E        +  where {got!r} = {expr}", "", f"{self.test_path}:{lineno}: AssertionError"]
            out.append("=" * 27 + " short test summary info " + "=" * 27)
            for name, expr, expected, got, _ in failures:
                out.append(f"FAILED {self.test_path}::{name} - assert {got!r} == {expected!r}")
        timing = f"{0.01 + 0.01 * len(dots):.2f}s"
        out.append(f"{failed} failed, {passed} passed in {timing}" if failed else f"{passed} passed in {timing}")
        return "\n".join(out), passed, failed


def coding_session(rng: random.Random) -> Transcript:
    r = Repo(rng)
    fn = r.bug_fn
    t = Transcript(rng, CODING_SYSTEM.format(repo=r.repo))
    output, passed, failed = r.pytest_output()
    failing = [line.split("::")[1].split(" ")[0] for line in output.split("\n") if line.startswith("FAILED")]
    asks = [f"The tests in {r.test_path} are failing. Can you fix it?",
            f"`{failing[0]}` fails since the last change. Please take a look.",
            f"Something is wrong with `{fn['name']}` in {r.src_path}, its tests fail. Could you fix it?",
            f"CI is red: {r.test_path} has failures. Please fix the bug."]
    t.user(rng.choice(asks))

    # 1. Reproduce.
    t.call("run_tests", {"path": r.test_path}, output,
           reasoning=maybe(rng, 0.6, "I'll run the failing tests first to see the error."))
    # 2. Read the code under test.
    expr, expected, got = next((e, evaluate(fn["src"], e), evaluate(buggy(fn), e)) for _, e in fn["tests"]
                               if evaluate(fn["src"], e) != evaluate(buggy(fn), e))
    t.call("read_file", {"path": r.src_path}, r.source(),
           reasoning=maybe(rng, 0.6, f"{failed} test{'s' if failed > 1 else ''} failed: `{expr}` returns {got!r} instead of "
                                     f"{expected!r}. Let me read `{fn['name']}` in {r.src_path}."),
           text=maybe(rng, 0.3, f"`{fn['name']}` returns the wrong value. Let me look at the code."))
    # 3. Fix the one line.
    correct_line, buggy_line = fn["bug"]
    t.call("edit_file", {"path": r.src_path, "old_str": buggy_line.strip(), "new_str": correct_line.strip()},
           f"Edited {r.src_path}: replaced 1 occurrence.",
           reasoning=maybe(rng, 0.8, f"`{fn['name']}` {fn['why']}. The fix is to {fn['fix']}."))
    r.fixed = True
    output, passed, failed = r.pytest_output()
    # 4. Verify.
    t.call("run_tests", {"path": r.test_path}, output, reasoning=maybe(rng, 0.4, "Now I'll run the tests again."))
    t.say(f"Fixed `{fn['name']}` in `{r.src_path}`. It {fn['why']}; I changed it to {fn['fix']}. "
          f"All {passed} tests in `{r.test_path}` pass now.")

    follow_ups = rng.sample(["regression", "suite", "commit"], rng.randint(1, 2))
    for follow in sorted(follow_ups, key=["regression", "suite", "commit"].index):
        if follow == "regression":
            t.user(rng.choice(["Thanks! Can you add a regression test for this?", "Please add a test that covers this bug.",
                               "Great. Add a regression test too, please."]))
            test_src = r.test_source()
            t.call("read_file", {"path": r.test_path}, test_src,
                   reasoning=maybe(rng, 0.5, f"I'll add a test for `{fn['regression']}` at the end of {r.test_path}."))
            last = test_src.rstrip("\n").split("\n")[-1]
            expected = evaluate(fn["src"], fn["regression"])
            name = f"test_{fn['name']}_regression"
            t.call("edit_file", {"path": r.test_path, "old_str": last,
                                 "new_str": f"{last}\n\n\ndef {name}():\n    assert {fn['regression']} == {expected!r}"},
                   f"Edited {r.test_path}: replaced 1 occurrence.")
            r.regression_added = True
            output, passed, failed = r.pytest_output()
            t.call("run_tests", {"path": r.test_path}, output)
            t.say(f"Added `{name}` to `{r.test_path}`: it checks that `{fn['regression']}` returns {expected!r}. "
                  f"All {passed} tests pass.")
        elif follow == "suite":
            t.user(rng.choice(["Can you run the whole test suite to be sure nothing else broke?",
                               "Please run all the tests.", "Run the full suite, please."]))
            total = passed + rng.randint(5, 40)
            t.call("bash", {"command": "python -m pytest -q"}, f"{'.' * min(total, 72)}\n{total} passed in {0.2 + total / 100:.2f}s",
                   reasoning=maybe(rng, 0.5, "I'll run the full suite with pytest."))
            t.say(f"The full suite passes: {total} tests, no failures.")
        else:
            t.user(rng.choice(["Looks good, please commit it.", "Commit the change, please.", "Great, commit this."]))
            message = f"Fix {fn['name']}: {fn['fix'].replace('`', '')}"
            sha = "".join(rng.choice("0123456789abcdef") for _ in range(7))
            files = 2 if r.regression_added else 1
            t.call("bash", {"command": f'git commit -am "{message}"'},
                   f"[main {sha}] {message}\n {files} file{'s' if files > 1 else ''} changed, {1 + 4 * (files - 1)} "
                   f"insertion{'s' if files > 1 else ''}(+), 1 deletion(-)",
                   reasoning=maybe(rng, 0.5, "I'll commit the change with a short message."))
            t.say(f"Committed as {sha}: \"{message}\".")
    return t


# =============================================================================================
# Sessions and files


BUILDERS = {"support": (support_session, SUPPORT_TOOLS), "coding": (coding_session, CODING_TOOLS)}


def generate(domain: str, seed: int, count: int, split: str = "") -> list[dict]:
    """`count` sessions of one domain; session i depends only on (domain, seed, i)."""
    build, tools = BUILDERS[domain]
    sessions = []
    for i in range(count):
        t = build(session_rng(domain, seed, i))
        sessions.append({
            "id": f"{domain}-{split or seed}-{i:04d}",
            "messages": t.messages,
            "tools": tools,
            "meta": {"domain": domain, "split": split, "seed": seed, "index": i,
                     "generator": "scripts/generate_sessions.py"},
        })
    return sessions


def to_jsonl(sessions: list[dict]) -> str:
    return "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in sessions)


def training_sessions(count: int, seed: int = TRAIN_SEED) -> list[dict]:
    """Half support, half coding, interleaved."""
    half = count // 2
    sup, cod = generate("support", seed, count - half, "train"), generate("coding", seed, half, "train")
    return [s for pair in zip(sup, cod) for s in pair] + sup[len(cod):]


def demo_sessions(seed: int = DEMO_SEED) -> dict[str, list[dict]]:
    return {domain: generate(domain, seed, n, "demo") for domain, n in DEMO_COUNTS.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("split", choices=["demo", "train"])
    parser.add_argument("-o", "--out", type=Path, help="train: the JSONL file; demo: the directory (default sessions/)")
    parser.add_argument("--count", type=int, default=800, help="train: how many sessions")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    if args.split == "demo":
        out = args.out or root / "sessions"
        out.mkdir(parents=True, exist_ok=True)
        for domain, sessions in demo_sessions(DEMO_SEED if args.seed is None else args.seed).items():
            (out / f"{domain}.jsonl").write_text(to_jsonl(sessions))
            print(f"wrote {len(sessions)} sessions to {out / f'{domain}.jsonl'}")
    else:
        out = args.out or root / "data" / "train.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        sessions = training_sessions(args.count, TRAIN_SEED if args.seed is None else args.seed)
        out.write_text(to_jsonl(sessions))
        print(f"wrote {len(sessions)} sessions to {out}")


if __name__ == "__main__":
    sys.exit(main())
