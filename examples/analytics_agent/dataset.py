"""The sample sales dataset: its own Postgres schema, created on first use, queried read-only.

It lives in the schema `analytics_sample` of the agent's own database, beside (never inside) the
memory tables (`public`) and the checkpointer's (`langgraph`): one server to run, three
owners kept apart by schema. The agent's SQL names the table unqualified (`FROM sales`) and
runs in a READ ONLY transaction whose search_path is this schema alone.

The rows are generated from a fixed seed, so every run of the example sees the same numbers.
"""

from __future__ import annotations

import random
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, text

SCHEMA = "analytics_sample"
TABLE_DOC = (
    "sales(order_id integer, order_date date, region text, product text, "
    "quantity integer, revenue numeric(12,2), is_return boolean)"
)
REGIONS = ("EMEA", "North America", "APAC", "LATAM")
PRODUCTS = {
    "Analytics Cloud": 1200,
    "Dashboards Pro": 450,
    "Data Connectors": 180,
    "Support Plan": 900,
}
ROWS = 2400
_LOCK = 0x414E_5341  # pg_advisory_xact_lock key: two first runs at once create it once
_DDL = f"""
CREATE TABLE IF NOT EXISTS {SCHEMA}.sales (
    order_id integer PRIMARY KEY,
    order_date date NOT NULL,
    region text NOT NULL,
    product text NOT NULL,
    quantity integer NOT NULL,
    revenue numeric(12, 2) NOT NULL,
    is_return boolean NOT NULL DEFAULT false
)
"""
_INSERT = f"""
INSERT INTO {SCHEMA}.sales (order_id, order_date, region, product, quantity, revenue, is_return)
VALUES (:order_id, :order_date, :region, :product, :quantity, :revenue, :is_return)
"""


def sample_rows(n: int = ROWS, seed: int = 2025) -> list[dict[str, Any]]:
    """Two years of orders (2024-2025); about 7% of them are returns."""
    rng = random.Random(seed)
    start, days = date(2024, 1, 1), 731
    weights = (0.38, 0.32, 0.19, 0.11)  # EMEA leads, LATAM trails
    rows = []
    for order_id in range(1, n + 1):
        product = rng.choice(list(PRODUCTS))
        quantity = rng.randint(1, 12)
        price = PRODUCTS[product] * rng.uniform(0.85, 1.15)
        rows.append(
            {
                "order_id": order_id,
                "order_date": start + timedelta(days=rng.randrange(days)),
                "region": rng.choices(REGIONS, weights)[0],
                "product": product,
                "quantity": quantity,
                "revenue": Decimal(f"{quantity * price:.2f}"),
                "is_return": rng.random() < 0.07,
            }
        )
    return rows


def ensure_dataset(engine: Engine) -> int:
    """Create the schema and table and load the rows unless already there; returns the count."""
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK})
        conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        conn.execute(text(_DDL))
        count = int(conn.execute(text(f"SELECT count(*) FROM {SCHEMA}.sales")).scalar_one())
        if count == 0:
            rows = sample_rows()
            conn.execute(text(_INSERT), rows)
            count = len(rows)
    return count


def run_query(engine: Engine, sql: str, limit: int = 200) -> dict[str, Any]:
    """Run the agent's SQL read-only against the dataset; JSON-ready columns and rows."""
    with engine.connect() as conn, conn.begin():
        conn.execute(text("SET TRANSACTION READ ONLY"))
        conn.execute(text(f"SET LOCAL search_path = {SCHEMA}"))
        conn.execute(text("SET LOCAL statement_timeout = '5s'"))
        result = conn.execute(text(sql))
        columns = list(result.keys())
        rows = [[_json_value(v) for v in row] for row in result.fetchmany(limit)]
    return {"columns": columns, "rows": rows}


def _json_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, date):
        return value.isoformat()
    return value
