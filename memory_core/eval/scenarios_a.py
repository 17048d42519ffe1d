"""Fidelity scenarios 1-3: a Nordic web shop, SaaS churn, a marketplace."""

from __future__ import annotations

from memory_core.cli.demo_script import Turn as T
from memory_core.eval.corpus import Dim, Domain, Metric, Say, Scenario

W = "where"
MONEY = Metric("revenue", "$money", "$alias")

NORDIC_SHOP = Scenario(
    name="nordic-shop",
    turns=42,
    domain=Domain(
        tables="orders o\nJOIN customers c ON c.id = o.customer_id",
        base=(("ts", "o.created_at"), ("amount", "o.amount_usd"), ("alias", "revenue"),
              (W, "o.created_at >= DATE '2025-01-01'")),
        dims=(Dim("country", "countries", "c.country", ("Sweden", "Norway", "Denmark", "Finland")),
              Dim("channel", "channels", "o.channel", ("web", "app", "marketplace")),
              Dim("category", "categories", "o.category", ("Home", "Outdoor", "Kitchen", "Toys"))),
        metrics=(MONEY, Metric("orders", "COUNT(*)", "orders"),
                 Metric("average order value", "ROUND(AVG($amount), 2)", "avg_order_value"),
                 Metric("repeat buyers", "COUNT(DISTINCT c.id) FILTER (WHERE $repeat)",
                        "repeat_buyers")),
        dashboards=("Nordic Weekly", "Board Pack"),
        table="orders",
        traps=(
            T("How many test accounts did QA create in March?",
              "QA created 37 test accounts in March.",
              ["SELECT COUNT(*) AS test_accounts\nFROM customers\nWHERE is_test\n"
               "  AND created_at >= DATE '2025-03-01' AND created_at < DATE '2025-04-01'"]),
            T("What's the EUR to SEK rate in the fx table today?",
              "1 EUR = 11.42 SEK as of this morning's load.",
              ["SELECT rate\nFROM fx_rates\nWHERE base = 'EUR' AND quote = 'SEK'\n"
               "ORDER BY rate_date DESC\nLIMIT 1"]),
            T("Do the Nordic stores run their own promotions?",
              "Yes, each Nordic country runs its own promo calendar; Denmark ran the most."),
            T("Were there many refunds in December?", "1,240 refunds in December, 3.1% of orders.",
              ["SELECT COUNT(*) AS refunds\nFROM orders\n"
               "WHERE status = 'refunded' AND created_at >= DATE '2025-12-01'"]),
        ),
    ),
    says=(
        Say("no-test-accounts", 2,
            "Before we start: leave out test accounts, they're flagged with is_test in customers.",
            "Got it - test accounts (customers.is_test) are excluded from every query from now "
            "on. That removes 412 customers.",
            r"(leave\W+out|exclud\w*|drop|without|remov\w*|ignor\w*|filter\w*\W+out)\W+"
            r"(all\W+|the\W+|any\W+)?test\W+accounts|test\W+accounts\W+(\(\S+\)\W+)?are\W+"
            r"(excluded|left\W+out|removed)|NOT\s+c\.is_test\b",
            ((W, "NOT c.is_test"),)),
        Say("nordics-only", 4,
            "Only the Nordics from now on - Sweden, Norway, Denmark and Finland.",
            "Understood, everything is scoped to SE, NO, DK and FI.",
            r"only\W+(the\W+)?nordics|nordics\W+only|"
            r"c\.country\s+IN\s+\('SE',\s*'NO',\s*'DK',\s*'FI'\)",
            ((W, "c.country IN ('SE', 'NO', 'DK', 'FI')"),)),
        Say("amounts-eur", 7, "Show amounts in EUR please, the board reads euros.",
            "Switched to EUR: amounts now come from amount_eur.",
            r"(amounts?|figures|numbers|values|revenue)\W+in\W+(EUR|euros?)\b|\bin\W+euros\b|"
            r"amount_eur",
            (("amount", "o.amount_eur"),)),
        Say("europe-wide", 12,
            "Let's widen it again to the whole of Europe - not just the four Nordic markets.",
            "Done - the country filter is gone; everything is Europe-wide now "
            "(c.region = 'Europe').",
            r"whole\W+of\W+europe|europe(-|\W)wide|all\W+of\W+europe|c\.region\s*=\s*'Europe'",
            ((W, "c.region = 'Europe'"),), replaces="nordics-only"),
        Say("round-thousands", 15, "Round everything to thousands, nobody needs the cents.",
            "Sure - money columns are rounded to the nearest thousand now.",
            r"round\w*\W+(\w+\W+){0,2}(to\W+)?(the\W+)?(nearest\W+)?thousands?\b|"
            r"ROUND\(SUM\([^)]*\),\s*-3\)",
            (("round", "-3"),)),
        Say("repeat-buyer", 19,
            "A repeat buyer is anyone with at least two paid orders in the trailing 12 months.",
            "Noted. Repeat buyers: 18,240 customers under that definition.",
            r"repeat\W+buyers?.{0,80}(two|2)\W+(paid\W+)?orders|HAVING\s+COUNT\(\*\)\s*>=\s*2",
            (("repeat", "c.id IN (SELECT customer_id FROM orders WHERE status = 'paid' AND "
              "created_at >= CURRENT_DATE - INTERVAL '12 months' GROUP BY 1 "
              "HAVING COUNT(*) >= 2)"),), uses="repeat"),
        Say("no-refunds", 24, "Drop refunded orders from everything too.",
            "Done, refunded orders are out (o.status <> 'refunded').",
            r"(drop|exclud\w*|leave\W+out|without|remov\w*)\W+(the\W+|all\W+)?refund(ed|s)?\b|"
            r"refunded\W+orders\W+are\W+out|o\.status\s*<>\s*'refunded'",
            ((W, "o.status <> 'refunded'"),)),
    ),
)  # fmt: skip

SAAS_CHURN = Scenario(
    name="saas-churn",
    turns=48,
    domain=Domain(
        tables="subscriptions s\nJOIN accounts a ON a.id = s.account_id",
        base=(("ts", "s.started_at"), ("amount", "s.mrr_usd"), ("alias", "mrr"),
              (W, "s.started_at >= DATE '2024-01-01'")),
        dims=(Dim("plan", "plans", "a.plan", ("Starter", "Growth", "Enterprise")),
              Dim("region", "regions", "a.region", ("EMEA", "Americas", "APAC")),
              Dim("segment", "segments", "a.segment", ("SMB", "Mid-market", "Strategic")),
              Dim("acquisition channel", "acquisition channels", "a.acquisition_channel",
                  ("organic", "paid", "outbound"))),
        metrics=(Metric("MRR", "$money", "$alias"),
                 Metric("new subscriptions", "COUNT(*)", "subscriptions"),
                 Metric("average seats", "ROUND(AVG(s.seats), 1)", "avg_seats"),
                 Metric("the number of churned accounts",
                        "COUNT(DISTINCT s.account_id) FILTER (WHERE $churned)",
                        "churned_accounts")),
        dashboards=("Churn Watch", "Exec MRR"),
        table="subscriptions",
        traps=(
            T("How many internal users logged in last week?",
              "212 staff accounts logged in last week.",
              ["SELECT COUNT(DISTINCT user_id) AS staff_logins\nFROM logins\n"
               "WHERE email LIKE '%@ourco.com' AND login_at >= CURRENT_DATE - 7"]),
            T("Which enterprise customers renewed early?",
              "Nine enterprise accounts renewed more than a month early; Northwind was the "
              "largest."),
            T("Is a free trial 14 or 30 days long?",
              "Free trials last 14 days; the sales-assisted ones 30."),
            T("What time zone is the billing system in?", "Billing timestamps are stored in UTC."),
        ),
    ),
    says=(
        Say("no-internal-users", 3,
            "Ignore internal users - anyone on an @ourco.com email is staff.",
            "OK, staff accounts (emails ending in @ourco.com) are filtered out from here on.",
            r"ignor\w*\W+(all\W+)?internal\W+users|internal\W+users.{0,40}(excluded|ignored|"
            r"left\W+out)|NOT\s+LIKE\s+'%@ourco\.com'",
            ((W, "a.email NOT LIKE '%@ourco.com'"),)),
        Say("churn-definition", 6,
            "By churned we mean a paying account that cancelled and didn't come back within "
            "30 days.",
            "Got it: churned = cancelled and no new subscription within 30 days of the "
            "cancellation.",
            r"churn\w*.{0,80}cancel\w*.{0,80}30\W+days|"
            r"s\.cancelled_at\s*\+\s*INTERVAL\s+'30 days'",
            (("churned", "s.cancelled_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "
              "subscriptions r WHERE r.account_id = s.account_id AND r.started_at BETWEEN "
              "s.cancelled_at AND s.cancelled_at + INTERVAL '30 days')"),), uses="churned"),
        Say("enterprise-only", 8, "Let's focus on enterprise plans for now.",
            "Scoped to the enterprise plan (a.plan = 'enterprise').",
            r"focus\w*\W+on\W+(the\W+)?enterprise|enterprise(\W+plans?)?\W+only|"
            r"only\W+(the\W+)?enterprise|a\.plan\s*=\s*'enterprise'",
            ((W, "a.plan = 'enterprise'"),)),
        Say("call-it-arr", 12,
            "Call it ARR everywhere, annualised - I don't want to see MRR in the output.",
            "Switched to ARR = MRR x 12 in every query.",
            r"call\w*\W+it\W+ARR|ARR\W+everywhere|ARR\W*=\W*MRR\W+x\W+12|s\.mrr_usd\s*\*\s*12",
            (("amount", "s.mrr_usd * 12"), ("alias", "arr"))),
        Say("pacific-time", 16, "Use Pacific time for all dates, finance sits in San Francisco.",
            "All timestamps are converted to America/Los_Angeles now.",
            r"pacific\W+time|America/Los_Angeles", (("tz", "America/Los_Angeles"),)),
        Say("all-plans", 20, "Scratch the big-customer focus - bring all plans back in, "
            "self-serve too.", "Done: every plan is back in the numbers.",
            r"all\W+plans|every\W+plan\b", replaces="enterprise-only"),
        Say("no-trials", 26, "Don't count accounts that are still in their free trial.",
            "Trial accounts are excluded (NOT a.in_trial).",
            r"(don'?t|do\W+not)\W+count\W+(accounts\W+)?(that\W+are\W+)?(still\W+)?in\W+"
            r"(their\W+|a\W+)?(free\W+)?trial|trial\W+accounts\W+are\W+excluded|NOT\s+a\.in_trial",
            ((W, "NOT a.in_trial"),)),
    ),
)  # fmt: skip

MARKETPLACE = Scenario(
    name="marketplace",
    turns=56,
    domain=Domain(
        tables="orders o\nJOIN sellers s ON s.id = o.seller_id",
        base=(("ts", "o.created_at"), ("amount", "o.net_revenue_usd"), ("alias", "revenue"),
              (W, "o.created_at >= DATE '2025-01-01'")),
        dims=(Dim("seller tier", "seller tiers", "s.tier", ("Gold", "Silver", "Bronze")),
              Dim("category", "categories", "o.category",
                  ("Fashion", "Electronics", "Home", "Beauty")),
              Dim("ship-to country", "ship-to countries", "o.ship_country",
                  ("US", "UK", "DE", "FR"))),
        metrics=(Metric("sales", "$money", "$alias"), Metric("orders", "COUNT(*)", "orders"),
                 Metric("take rate", "ROUND(100.0 * SUM(o.fee_usd) / "
                        "NULLIF(SUM(o.gross_value_usd), 0), 1)", "take_rate_pct"),
                 Metric("active sellers", "COUNT(DISTINCT s.id) FILTER (WHERE $active_seller)",
                        "active_sellers")),
        dashboards=("Marketplace Health", "Seller Ops"),
        table="sellers",
        traps=(
            T("What's the difference between GMV and net revenue on our invoices?",
              "GMV is what buyers paid; net revenue is our fees after refunds."),
            T("How many orders got cancelled last week?",
              "318 orders were cancelled last week, mostly Fashion.",
              ["SELECT COUNT(*) AS cancelled\nFROM orders\n"
               "WHERE status = 'cancelled' AND created_at >= CURRENT_DATE - 7"]),
            T("When does the fiscal year close for the Australian entity?",
              "The Australian entity closes its fiscal year on 30 June."),
            T("Are demo sellers visible to buyers?",
              "No, demo sellers are hidden from search and checkout."),
        ),
    ),
    says=(
        Say("call-it-gmv", 2,
            "Call it GMV, not revenue - we mean gross merchandise value, what buyers paid "
            "including fees.",
            "Will do: GMV = SUM(gross_value_usd), labelled gmv.",
            r"call\w*\W+it\W+GMV|GMV,?\W+not\W+revenue|AS\s+gmv\b",
            (("amount", "o.gross_value_usd"), ("alias", "gmv"))),
        Say("no-cancelled", 4, "Drop cancelled orders from everything.",
            "Cancelled orders are excluded from now on (o.status <> 'cancelled').",
            r"(drop|exclud\w*|leave\W+out|without|remov\w*|ignor\w*)\W+(all\W+)?(the\W+)?"
            r"cancel+ed\W+orders|cancel+ed\W+orders\W+are\W+excluded|"
            r"o\.status\s*<>\s*'cancelled'",
            ((W, "o.status <> 'cancelled'"),)),
        Say("fiscal-july", 8,
            "We report on a fiscal year that starts in July, so quarters should follow that.",
            "Quarters now follow the July fiscal year (fiscal_quarter with start_month => 7).",
            r"fiscal\W+year.{0,40}(starts?|starting|begins?)\W+(in\W+)?july|july\W+fiscal|"
            r"start_month\s*=>\s*7",
            (("calendar", "fiscal:7"),), grain="quarter"),
        Say("active-seller", 12,
            "An active seller is one who listed at least one item in the last 30 days.",
            "OK - active sellers: 4,812 under that rule.",
            r"active\W+sellers?.{0,80}list\w*.{0,60}30\W+days|"
            r"s\.last_listed_at\s*>=\s*CURRENT_DATE\s*-\s*INTERVAL\s+'30 days'",
            (("active_seller", "s.last_listed_at >= CURRENT_DATE - INTERVAL '30 days'"),),
            uses="active_seller"),
        Say("thousands-of-dollars", 16, "Show money in thousands of dollars with one decimal.",
            "Money columns are now in $k with one decimal.",
            r"thousands\W+of\W+dollars|\$k\W+with\W+one\W+decimal|/\s*1000\.0,\s*1\)",
            (("round", "k1"),)),
        Say("calendar-quarters", 30,
            "Switch back to calendar quarters - ops found the shifted ones confusing.",
            "Back on calendar quarters.",
            r"calendar\W+quarters", (("calendar", "calendar"),), replaces="fiscal-july",
            grain="quarter"),
        Say("no-demo-sellers", 38, "Leave out our own demo sellers too, seller_type = 'demo'.",
            "Demo sellers are now excluded.",
            r"(leave\W+out|exclud\w*|drop|ignor\w*|without)\W+(our\W+own\W+)?demo\W+sellers|"
            r"demo\W+sellers\W+are\W+(now\W+)?excluded|s\.seller_type\s*<>\s*'demo'",
            ((W, "s.seller_type <> 'demo'"),)),
    ),
)  # fmt: skip

SCENARIOS = (NORDIC_SHOP, SAAS_CHURN, MARKETPLACE)
