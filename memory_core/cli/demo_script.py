"""The scripted analytics conversation `agent-memory demo` plays (data only, no I/O).

Each turn is what an analytics agent hands over at finalize: the user's question, the answer,
the SQL that ran and the Redash objects it built (visualizations with their full `options`,
dashboards with widgets). Memory keeps only compact descriptors of the Redash objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memory_core.copy.views import Focus

OWNER = "demo-analyst"
FOLLOW_UP = "now make that a bar chart by quarter"
# The node views shown for the follow-up, and who reads each (docs/ARCHITECTURE.md, "The flow").
VIEWS: tuple[tuple[Focus, str], ...] = (
    ("brief", "intent detection"),
    ("sql", "SQL generator / query editor"),
    ("visualizations", "add/edit visualization nodes"),
)


@dataclass(frozen=True)
class Turn:
    user_query: str
    answer: str
    sql: list[str] = field(default_factory=list)
    visualizations: list[dict[str, Any]] = field(default_factory=list)
    dashboards: list[dict[str, Any]] = field(default_factory=list)
    # What the agent declares stands ({subject, text}); None: it declares nothing.
    standing_instructions: list[dict[str, str | None]] | None = None


def chart(vid: int, name: str, series_type: str, mapping: dict[str, str]) -> dict[str, Any]:
    """A Redash CHART visualization as the agent holds it: the full options blob."""
    return {
        "id": vid,
        "type": "CHART",
        "name": name,
        "description": "",
        "options": {
            "globalSeriesType": series_type,
            "columnMapping": mapping,
            "legend": {"enabled": True, "placement": "auto", "traceorder": "normal"},
            "xAxis": {"type": "-", "labels": {"enabled": True}},
            "yAxis": [{"type": "linear"}, {"type": "linear", "opposite": True}],
            "series": {"stacking": "stack" if "stack" in name.lower() else None},
            "seriesOptions": {
                col: {"type": series_type, "yAxis": 0} for col, r in mapping.items() if r == "y"
            },
            "numberFormat": "0,0[.]00",
            "percentFormat": "0[.]00%",
            "dateTimeFormat": "YYYY-MM-DD",
            "showDataLabels": series_type == "pie",
        },
    }


def table(vid: int, name: str) -> dict[str, Any]:
    return {
        "id": vid,
        "type": "TABLE",
        "name": name,
        "options": {"itemsPerPage": 25, "columns": [], "autoHeight": True},
    }


def dashboard(did: int, name: str, *viz_ids: int) -> dict[str, Any]:
    return {
        "id": did,
        "name": name,
        "slug": name.lower().replace(" ", "-"),
        "widgets": [
            {
                "id": 900 + v,
                "visualization_id": v,
                "width": 1,
                "options": {"position": {"col": 0, "row": 3 * i, "sizeX": 3, "sizeY": 8}},
            }
            for i, v in enumerate(viz_ids)
        ],
    }


def q(select: str, where: str = "", group: str = "1", order: str = "1") -> str:
    """SQL the agent ran: sales of 2025 without returns (the filters the user set), plus more."""
    sql = f"SELECT {select}\nFROM sales\nWHERE year = 2025 AND NOT is_return{where}"
    return sql + (f"\nGROUP BY {group}\nORDER BY {order}" if group else "")


NET = "SUM(revenue - discount) AS net_revenue"
EMEA, APAC, CLEAN = " AND region = 'EMEA'", " AND region = 'APAC'", " AND NOT is_test_account"
ELEC = APAC + " AND category = 'Electronics'"
CHURN = "\nFROM customer_quarters -- active last quarter, not this one\nWHERE churned"
T = Turn
CONVERSATION: list[Turn] = [
    T("Revenue by region for 2025",
      "2025 revenue was $48.2M: EMEA $19.8M (41%), North America $17.1M, APAC $11.3M.",
      ["SELECT region, SUM(revenue) AS revenue\nFROM sales\nWHERE year = 2025\nGROUP BY 1"]),
    T("Same, but excluding returns",
      "Excluding returns, 2025 revenue is $45.9M; EMEA still leads with $18.9M.",
      [q("region, SUM(revenue) AS revenue", order="2 DESC")]),
    T("Break that down by quarter",
      "Q4 is the strongest quarter in every region; EMEA Q4 alone is $5.9M.",
      [q("region, quarter, SUM(revenue) AS revenue", group="1, 2", order="1, 2")]),
    T("Make that a bar chart",
      "Here is a grouped bar chart of quarterly revenue by region.",
      visualizations=[chart(101, "Quarterly revenue by region", "column",
                            {"quarter": "x", "revenue": "y", "region": "series"})]),
    T("Add it to a new dashboard called Sales 2025",
      "Created dashboard 'Sales 2025' with the quarterly revenue chart.",
      dashboards=[dashboard(7, "Sales 2025", 101)]),
    T("Filter to EMEA only",
      "EMEA 2025 revenue excluding returns: $18.9M, growing every quarter.",
      [q("quarter, SUM(revenue) AS revenue", EMEA)]),
    T("Which countries drive the EMEA growth?",
      "Germany (+18%), France (+11%) and the UK (+9%) account for most of EMEA growth.",
      [q("country, SUM(revenue) AS revenue", EMEA, order="2 DESC")]),
    T("Show the top 10 countries as a horizontal bar chart",
      "Added a horizontal bar chart of the top 10 EMEA countries by revenue.",
      [q("country, SUM(revenue) AS revenue", EMEA, order="2 DESC LIMIT 10")],
      [chart(102, "Top 10 EMEA countries", "bar", {"country": "x", "revenue": "y"})]),
    T("Define an active customer as one with a non-returned order in the last 90 days",
      "Noted: active customer = at least one non-returned order in the trailing 90 days. "
      "There are 12,480 active customers today.",
      ["SELECT COUNT(DISTINCT customer_id) AS active_customers\nFROM sales\n"
       "WHERE NOT is_return AND order_date >= CURRENT_DATE - 90"]),
    T("How many active customers per region?",
      "Active customers: EMEA 5,210, North America 4,630, APAC 2,640.",
      ["SELECT region, COUNT(DISTINCT customer_id) AS active_customers\nFROM sales\n"
       "WHERE NOT is_return AND order_date >= CURRENT_DATE - 90\nGROUP BY 1"]),
    T("Plot active customers by month for 2025 as a line chart",
      "Line chart added: active customers rose from 10.9k in January to 12.5k in December.",
      ["SELECT month, active_customers\nFROM monthly_active_customers\nWHERE year = 2025"],
      [chart(103, "Active customers by month", "line", {"month": "x", "active_customers": "y"})]),
    T("Add that to the Sales 2025 dashboard",
      "The Sales 2025 dashboard now has 3 widgets.",
      dashboards=[dashboard(7, "Sales 2025", 101, 102, 103)]),
    T("What's the average order value for active customers vs everyone else?",
      "Active customers average $212 per order, others $148 (+43%).",
      [q("is_active, AVG(revenue) AS avg_order_value")]),
    T("From now on use net revenue: revenue minus discounts",
      "Understood: net revenue = SUM(revenue - discount), returns excluded. 2025 net revenue "
      "is $42.7M.",
      [q(NET, group="")]),
    T("Redo revenue by region with net revenue",
      "Net revenue 2025: EMEA $17.6M, North America $15.9M, APAC $9.2M.",
      [q(f"region, {NET}", order="2 DESC")]),
    T("Compare 2025 with 2024 by quarter",
      "Every quarter of 2025 beats 2024; the gap is widest in Q4 (+14%).",
      [f"SELECT year, quarter, {NET}\nFROM sales\nWHERE year IN (2024, 2025) AND NOT is_return"
       "\nGROUP BY 1, 2\nORDER BY 1, 2"]),
    T("Show year-over-year growth as a percentage",
      "YoY net revenue growth: Q1 +6.1%, Q2 +8.4%, Q3 +9.0%, Q4 +14.2%.",
      ["SELECT quarter, 100.0 * (net_2025 / net_2024 - 1) AS yoy_pct\n"
       "FROM quarterly_net_revenue\nORDER BY 1"]),
    T("Make a combo chart: bars for net revenue, a line for YoY growth",
      "Combo chart created with net revenue bars and the YoY growth line on a second axis.",
      visualizations=[chart(104, "Net revenue and YoY growth", "combo",
                            {"quarter": "x", "net_revenue": "y", "yoy_pct": "y"})]),
    T("Which product categories grew fastest in EMEA?",
      "In EMEA, Outdoor (+31%), Home (+22%) and Electronics (+12%) grew fastest.",
      [q(f"category, {NET}", EMEA, order="2 DESC")]),
    T("Only consider categories with more than $1M of 2024 net revenue",
      "With the $1M floor, Home (+22%) and Electronics (+12%) remain the top growers.",
      [q(f"category, {NET}", EMEA + " AND category IN (SELECT category FROM big_categories_2024)",
         order="2 DESC")]),
    T("Pie chart of EMEA 2025 net revenue by category",
      "Pie chart added: Home 34%, Electronics 29%, Outdoor 18%, other 19%.",
      visualizations=[chart(105, "EMEA net revenue by category", "pie",
                            {"category": "x", "net_revenue": "y"})]),
    T("Add it to the dashboard",
      "Added the pie chart to Sales 2025 (now 5 widgets).",
      dashboards=[dashboard(7, "Sales 2025", 101, 102, 103, 104, 105)]),
    T("Now look at APAC: same category breakdown",
      "APAC net revenue by category: Electronics $3.1M, Home $2.4M, Outdoor $1.2M.",
      [q(f"category, {NET}", APAC, order="2 DESC")]),
    T("Why did Electronics drop in Q3 in APAC?",
      "APAC Electronics fell 17% in Q3: online orders held up, retail dropped 34%.",
      [q(f"month, channel, {NET}", ELEC, group="1, 2")]),
    T("Break Electronics in APAC down by channel: online vs retail",
      "Online is 58% of APAC Electronics for 2025, up from 44% in 2024.",
      [q(f"channel, {NET}", ELEC)]),
    T("Stacked bar chart of that by month",
      "Stacked bar chart of APAC Electronics by month and channel added.",
      visualizations=[chart(106, "APAC Electronics by channel (stacked)", "column",
                            {"month": "x", "net_revenue": "y", "channel": "series"})]),
    T("Create a separate dashboard 'APAC deep dive' with that chart",
      "Created dashboard 'APAC deep dive' with the stacked channel chart.",
      dashboards=[dashboard(8, "APAC deep dive", 106)]),
    T("Define churned as active last quarter but not active this quarter",
      "Noted: churned = active in the previous quarter, not active in the current one.",
      ["SELECT quarter, COUNT(*) AS churned_customers" + CHURN + "\nGROUP BY 1"]),
    T("What's the quarterly churn rate of active customers?",
      "Churn rate: Q1 7.9%, Q2 7.1%, Q3 8.8%, Q4 6.4%.",
      ["SELECT quarter, 100.0 * AVG(churned::int) AS churn_pct\nFROM customer_quarters\n"
       "GROUP BY 1"]),
    T("Churn by region as a table",
      "Table added: APAC has the highest churn (9.6% in Q3).",
      ["SELECT region, quarter, 100.0 * AVG(churned::int) AS churn_pct\nFROM customer_quarters\n"
       "GROUP BY 1, 2"],
      [table(107, "Churn by region and quarter")]),
    T("Exclude test accounts everywhere: their emails end in @example.com",
      "Test accounts are now excluded: that removes 212 customers and $0.3M of net revenue.",
      [q(NET, CLEAN, group="")]),
    T("Re-run churn by region without the test accounts",
      "Without test accounts churn is slightly lower: APAC Q3 is 9.1%.",
      ["SELECT region, quarter, 100.0 * AVG(churned::int) AS churn_pct\nFROM customer_quarters\n"
       "WHERE NOT is_test_account\nGROUP BY 1, 2"]),
    T("Cohort retention by signup month for 2025",
      "Month-3 retention ranges from 41% (January cohort) to 52% (June cohort).",
      [q("signup_month, months_since_signup, COUNT(DISTINCT customer_id) AS customers", CLEAN,
         group="1, 2", order="1, 2")]),
    T("Heatmap of that cohort table",
      "Cohort heatmap added (cohort x months since signup).",
      visualizations=[chart(108, "2025 cohort retention", "heatmap",
                            {"months_since_signup": "x", "signup_month": "y",
                             "customers": "series"})]),
    T("Add the cohort heatmap to Sales 2025",
      "Sales 2025 now has 6 widgets.",
      dashboards=[dashboard(7, "Sales 2025", 101, 102, 103, 104, 105, 108)]),
    T("Top 20 customers by net revenue in EMEA",
      "The top 20 EMEA customers bring $4.4M (25% of EMEA net revenue).",
      [q(f"customer_name, {NET}", EMEA + CLEAN, order="2 DESC LIMIT 20")]),
    T("Include their account manager",
      "Added account managers: Dana Weiss manages 6 of the top 20.",
      [q(f"customer_name, account_manager, {NET}", EMEA + CLEAN, group="1, 2",
         order="3 DESC LIMIT 20")]),
    T("Which account managers have the most churned revenue?",
      "Churned net revenue is highest for Li Wei ($410k) and Tom Okafor ($380k).",
      ["SELECT account_manager, SUM(last_quarter_net_revenue) AS churned_revenue" + CHURN
       + " AND NOT is_test_account\nGROUP BY 1\nORDER BY 2 DESC"]),
    T("Bar chart of churned revenue by account manager",
      "Bar chart of churned revenue by account manager added.",
      visualizations=[chart(109, "Churned revenue by account manager", "column",
                            {"account_manager": "x", "churned_revenue": "y"})]),
    T("Forecast Q1 2026 net revenue by region from the 2025 trend",
      "Linear trend forecast for Q1 2026: EMEA $4.9M, North America $4.3M, APAC $2.5M.",
      ["SELECT region, regr_intercept(net_revenue, quarter) + 5 * regr_slope(net_revenue, "
       "quarter)\n       AS forecast_q1_2026\nFROM quarterly_net_revenue_by_region\nGROUP BY 1"]),
    T("Show the forecast vs actuals as a line chart",
      "Line chart of actuals (2025) and the Q1 2026 forecast added.",
      visualizations=[chart(110, "Net revenue: actuals vs forecast", "line",
                            {"quarter": "x", "net_revenue": "y", "region": "series"})]),
    T("Put the forecast chart on the APAC deep dive dashboard too",
      "APAC deep dive now has 2 widgets.",
      dashboards=[dashboard(8, "APAC deep dive", 106, 110)]),
    T("Summarise the key findings for the Sales 2025 dashboard",
      "Key findings: EMEA leads (41%), Q4 strongest, Home and Electronics grow fastest, "
      "APAC retail Electronics fell in Q3, churn peaked in Q3 at 8.8%."),
    T("Show net revenue by region for Q4 2025 only",
      "Q4 2025 net revenue: EMEA $5.4M, North America $4.8M, APAC $2.7M.",
      [q(f"region, {NET}", CLEAN + " AND quarter = 4", order="2 DESC")]),
]  # fmt: skip

FAILURE_TOPIC = "Weekly signups by acquisition channel"


def failure_turn(n: int) -> Turn:
    """The n-th quick turn of the second thread (pushed over the fold threshold)."""
    return Turn(
        f"{FAILURE_TOPIC}, week {n} of 2025",
        f"Week {n}: 1,{200 + 7 * n} signups, paid search leads with {30 + n % 7}%.",
        [
            "SELECT channel, COUNT(*) AS signups\nFROM customers\n"
            f"WHERE signup_year = 2025 AND signup_week = {n}\nGROUP BY 1"
        ],
    )
