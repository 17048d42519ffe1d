"""Held-out fidelity scenarios 28-30: pharmacy inventory, university admissions, cloud costs.

Held-out like scenarios_i.py: written blind to the instruction detector, never tuned against,
worded anew (nothing repeats scenarios_a..h). Three replacements each in the pharmacy and
cloud conversations: a definition, a restriction lifted, and a unit or valuation changed.
"""

from __future__ import annotations

from memory_core.cli.demo_script import Turn as T
from memory_core.eval.corpus import Dim, Domain, Metric, Say, Scenario

W = "where"
COVER = "ROUND(SUM(m.on_hand) / NULLIF(SUM(m.dispensed_{0}d) / {0}.0, 0), 1)"
COUNT_IF = "COUNT(*) FILTER (WHERE ap.{})"
RATE = f"ROUND(100.0 * {COUNT_IF} / NULLIF({COUNT_IF}, 0), 1)"  # RATE.format(num, denom)
NO_CD = "COALESCE(p.cd_schedule, 0) NOT IN (2, 3)"
THURSDAY_WEEK = "date_trunc('week', $ts - INTERVAL '3 days') + INTERVAL '3 days'"

PHARMACY = Scenario(
    name="pharmacy-inventory",
    turns=74,
    holdout=True,
    domain=Domain(
        tables="stock_movements m\nJOIN products p ON p.sku = m.sku",
        base=(("ts", "m.moved_at"), ("amount", "m.retail_value_gbp"), ("alias", "retail_value"),
              (W, "m.moved_at >= DATE '2025-01-01'")),
        dims=(Dim("branch", "branches", "m.branch", ("Leeds", "York", "Harrogate", "Wakefield")),
              Dim("category", "categories", "p.category",
                  ("prescription", "over the counter", "beauty")),
              Dim("wholesaler", "wholesalers", "p.wholesaler", ("Alliance", "Phoenix", "AAH"))),
        metrics=(Metric("stock value", "$money", "$alias"),
                 Metric("units moved", "SUM(m.qty)", "units"),
                 Metric("days of cover", "$cover", "cover_days"),
                 Metric("stockouts", "COUNT(*) FILTER (WHERE m.on_hand = 0)", "stockouts"),
                 Metric("expiry write-offs", "SUM(m.qty) FILTER (WHERE m.reason = 'expired')",
                        "expired_units")),
        dashboards=("Stock Room", "Finance Pack"),
        table="stock_movements",
        traps=(
            T("How many packs did we send back to Phoenix as short-dated last month?",
              "1,870 packs, mostly antibiotics.",
              ["SELECT p.wholesaler, SUM(m.qty) AS returned\nFROM stock_movements m\n"
               "JOIN products p ON p.sku = m.sku\nWHERE m.movement_type = 'return'\n"
               "  AND m.moved_at >= DATE '2025-05-01'\nGROUP BY 1"]),
            T("Who signs the controlled drugs register at York?",
              "The responsible pharmacist on each shift."),
            T("What margin do we make on a typical beauty line?", "Around 35% at shelf price."),
            T("Is the Wakefield robot dispensing at weekends yet?",
              "From next month, Saturdays only."),
        ),
    ),
    says=(
        Say("no-transfers", 3, "Inter-branch transfers only shuffle boxes between our own "
            "shelves; please don't count them as movements.",
            "Transfers between branches are excluded (m.movement_type <> 'transfer').",
            r"inter-branch\W+transfers.{0,80}don'?t\W+count|transfers\W+between\W+branches\W+"
            r"are\W+excluded|m\.movement_type\s*<>\s*'transfer'",
            ((W, "m.movement_type <> 'transfer'"),)),
        Say("cover-28", 6, "Days of cover: units on hand divided by average daily dispensing "
            "over the trailing 28 days.", "Cover = on-hand / (28-day dispensed / 28).",
            r"trailing\W+28\W+days|28-day\W+dispensed|m\.dispensed_28d\b",
            (("cover", COVER.format(28)),), uses="cover"),
        Say("cost-value", 9, "For valuation, the auditors want stock at cost price rather than "
            "retail,", "Stock is now valued at cost (m.qty * p.unit_cost_gbp),",
            r"stock\W+at\W+cost\W+price|valued\W+at\W+cost|m\.qty\s*\*\s*p\.unit_cost_gbp",
            (("amount", "m.qty * p.unit_cost_gbp"), ("alias", "cost_value")), uses="alias"),
        Say("no-pence", 9, "and drop the pence while you're at it.", "with pence rounded away.",
            r"drop\W+the\W+pence|pence\W+rounded\W+away|ROUND\(SUM\([^()]*\)\)",
            (("round", "0"),)),
        Say("nhs-year", 19, "Quarters on the NHS financial year, please - April through March.",
            "Quarters now start in April.",
            r"NHS\W+financial\W+year|quarters\W+now\W+start\W+in\W+april|start_month\s*=>\s*4\b",
            (("calendar", "fiscal:4"),), grain="quarter"),
        Say("no-cd", 28, "Which branch wastes the most on short-dated stock? And from now on "
            "keep Schedule 2 and 3 controlled drugs out of these figures - they're reconciled "
            "in a separate register.",
            f"York, mostly insulin pens. Controlled drugs are now excluded ({NO_CD}).",
            r"schedule\W+2\W+and\W+3|controlled\W+drugs\W+are\W+now\W+excluded|"
            r"COALESCE\(p\.cd_schedule,\s*0\)\s+NOT\s+IN\s+\(2,\s*3\)",
            ((W, NO_CD),)),
        Say("cover-13w", 38, "Procurement finds four weeks too jumpy. Base cover on average "
            "demand across the last 13 weeks.",
            "Cover now uses 91-day dispensing (m.dispensed_91d / 91.0).",
            r"last\W+13\W+weeks|91-day\W+dispensing|m\.dispensed_91d\b",
            (("cover", COVER.format(91)),), replaces="cover-28", uses="cover"),
        Say("cd-back", 45, "The CD register is reconciled, so controlled lines can come back "
            "into the stock views.", "Schedule filter removed; controlled drugs count again.",
            r"controlled\W+lines\W+can\W+come\W+back|schedule\W+filter\W+removed|"
            r"controlled\W+drugs\W+count\W+again",
            replaces="no-cd"),
        Say("gbp-k1", 49, "The finance director's board pack shows stock value in £k to one "
            "decimal; match that.", "Values now in £ thousands, one decimal.",
            r"£k\W+to\W+one\W+decimal|£\W+thousands,\W+one\W+decimal|/\s*1000\.0,\s*1\)",
            (("round", "k1"),), replaces="no-pence", uses="alias"),
    ),
)  # fmt: skip

ADMISSIONS = Scenario(
    name="university-admissions",
    turns=91,
    holdout=True,
    domain=Domain(
        tables="applications ap\nJOIN programmes pg ON pg.id = ap.programme_id",
        base=(("ts", "ap.submitted_at"), ("amount", "ap.deposit_usd"), ("alias", "deposits"),
              (W, "ap.submitted_at >= DATE '2024-09-01'")),
        dims=(Dim("faculty", "faculties", "pg.faculty",
                  ("Engineering", "Business", "Arts", "Health Sciences")),
              Dim("residency", "residencies", "ap.residency", ("domestic", "international")),
              Dim("entry round", "entry rounds", "ap.round", ("early", "main", "clearing"))),
        metrics=(Metric("applications", "COUNT(*)", "applications"),
                 Metric("deposits", "$money", "$alias"),
                 Metric("offer rate", "$offer", "offer_rate_pct"),
                 Metric("yield", "$yield", "yield_pct"),
                 Metric("average entry score", "ROUND(AVG(ap.entry_score), 1)", "avg_score")),
        dashboards=("Admissions Funnel", "Council Report"),
        table="applications",
        traps=(
            T("How many applicants withdrew after receiving an offer?",
              "About 640, most of them to a rival's early offer.",
              ["SELECT COUNT(*) AS withdrawn\nFROM applications ap\nWHERE ap.offer_made\n"
               "  AND ap.withdrawn_at IS NOT NULL"]),
            T("When does the clearing hotline open?",
              "At 8am on the morning results are published."),
            T("Do international students pay their deposit by card?",
              "Mostly by bank transfer through the payments partner."),
            T("What entry score does Health Sciences ask for?",
              "A minimum of 85, plus an interview."),
        ),
    ),
    says=(
        Say("one-per-person", 2, "People who apply both through the portal and through an agent "
            "show up twice. Count each person once per programme.",
            "Using primary records only (ap.is_primary_record).",
            r"count\W+each\W+person\W+once|primary\W+records\W+only|ap\.is_primary_record\b",
            ((W, "ap.is_primary_record"),)),
        Say("offer-rate", 5, "By offer rate I mean offers made divided by complete applications; "
            "incomplete ones never reach a reviewer.",
            "The offer rate's denominator is now complete applications only.",
            r"offers\W+made\W+divided\W+by\W+complete|denominator\W+is\W+now\W+complete|"
            r"FILTER\s+\(WHERE\s+ap\.is_complete\)",
            (("offer", RATE.format("offer_made", "is_complete")),), uses="offer"),
        Say("yield-accept", 8, "Yield: accepted offers over offers made.",
            "Yield = acceptances / offers.",
            r"accepted\W+offers\W+over\W+offers\W+made|yield\W*=\W*acceptances|"
            r"FILTER\s+\(WHERE\s+ap\.accepted\)",
            (("yield", RATE.format("accepted", "offer_made")),), uses="yield"),
        Say("cycle-sept", 12, "Our admissions cycle opens on 1 September, so make quarters "
            "cycle quarters.", "Quarters now follow the September cycle.",
            r"admissions\W+cycle\W+opens\W+on\W+1\W+september|september\W+cycle|"
            r"start_month\s*=>\s*9\b",
            (("calendar", "fiscal:9"),), grain="quarter"),
        Say("aud-dollar", 16, "The finance office reconciles deposits in Australian dollars - "
            "use the AUD amounts, rounded to the dollar.",
            "Deposits now read ap.deposit_aud, whole dollars.",
            r"reconciles\W+deposits\W+in\W+australian\W+dollars|ap\.deposit_aud\b",
            (("amount", "ap.deposit_aud"), ("alias", "deposits_aud"), ("round", "0")),
            uses="alias"),
        Say("intl-only", 35, "The international office is my audience for the next while, so "
            "international applicants only.",
            "Filtered to ap.residency = 'international'.",
            r"international\W+applicants\W+only|ap\.residency\s*=\s*'international'",
            ((W, "ap.residency = 'international'"),)),
        Say("no-clearing", 42, "Engineering looks soft this cycle - is that the new maths "
            "prerequisite? Oh, and ignore the late clearing round from here on; those offers "
            "go out within 48 hours and skew every rate.",
            "Largely, yes: complete applications fell 18% after it was announced. Clearing is "
            "now excluded (ap.round <> 'clearing').",
            r"ignore\W+the\W+late\W+clearing\W+round|clearing\W+is\W+now\W+excluded|"
            r"ap\.round\s*<>\s*'clearing'",
            ((W, "ap.round <> 'clearing'"),)),
        Say("yield-enrol", 55, "The provost counts yield on enrolment, not acceptance: someone "
            "who accepts and never turns up isn't yield.",
            "Yield now counts enrolled students over offers (ap.enrolled).",
            r"yield\W+on\W+enrolment|counts\W+enrolled\W+students|"
            r"FILTER\s+\(WHERE\s+ap\.enrolled\)",
            (("yield", RATE.format("enrolled", "offer_made")),), replaces="yield-accept",
            uses="yield"),
        Say("home-back", 60, "Domestic students are back in; the dean wants the full picture "
            "for council.", "Residency filter removed - domestic and international together.",
            r"domestic\W+students\W+are\W+back|full\W+picture\W+for\W+council|"
            r"residency\W+filter\W+removed",
            replaces="intl-only"),
    ),
)  # fmt: skip

CLOUD = Scenario(
    name="cloud-costs",
    turns=103,
    holdout=True,
    domain=Domain(
        tables="cost_lines c\nJOIN account_owners ao ON ao.account_id = c.account_id",
        base=(("ts", "c.usage_date"), ("amount", "c.unblended_cost_usd"), ("alias", "spend"),
              (W, "c.usage_date >= DATE '2025-01-01'")),
        dims=(Dim("team", "teams", "ao.team", ("payments", "search", "data platform", "mobile")),
              Dim("service", "services", "c.service", ("EC2", "S3", "RDS", "Lambda")),
              Dim("environment", "environments", "ao.env", ("prod", "staging", "dev"))),
        metrics=(Metric("spend", "$money", "$alias"),
                 Metric("resources", "COUNT(DISTINCT c.resource_id)", "resources"),
                 Metric("idle share", "ROUND(100.0 * AVG(($idle)::int), 1)", "idle_pct"),
                 Metric("cost per million requests",
                        "ROUND(SUM($amount) / NULLIF(SUM(c.requests) / 1e6, 0), 2)",
                        "cost_per_m_requests"),
                 Metric("savings plan coverage",
                        "ROUND(100.0 * SUM(c.covered_usage) / NULLIF(SUM(c.usage), 0), 1)",
                        "coverage_pct")),
        dashboards=("FinOps Weekly", "Engineering Costs"),
        table="cost_lines",
        traps=(
            T("How much did the data platform team spend on spot instances last month?",
              "About $41k, roughly a third of their EC2 bill.",
              ["SELECT SUM(c.unblended_cost_usd) AS spot_spend\nFROM cost_lines c\n"
               "JOIN account_owners ao ON ao.account_id = c.account_id\n"
               "WHERE c.purchase_option = 'Spot'\n  AND ao.team = 'data platform'"]),
            T("When does our savings plan commitment renew?",
              "Next March; it's a three-year compute plan."),
            T("Who approves new production accounts?",
              "The platform team, through the landing-zone pipeline."),
            T("Is the EDP discount applied per account or across the org?",
              "Across the whole organisation, on eligible services."),
        ),
    ),
    says=(
        Say("amortized", 3, "Use amortized cost rather than unblended: reserved-instance fees "
            "should be spread over their term, otherwise January looks insane.",
            "Spend now uses c.amortized_cost_usd.",
            r"amortized\W+cost\W+rather\W+than\W+unblended|c\.amortized_cost_usd\b",
            (("amount", "c.amortized_cost_usd"), ("alias", "amortized_spend")), uses="alias"),
        Say("no-credits", 6, "Credits and refunds are one-off adjustments, not consumption. "
            "Strip those line items.",
            "Credit and refund lines removed (c.line_type NOT IN ('Credit', 'Refund')).",
            r"credits\W+and\W+refunds.{0,60}strip|credit\W+and\W+refund\W+lines\W+removed|"
            r"c\.line_type\s+NOT\s+IN\s+\('Credit',\s*'Refund'\)",
            ((W, "c.line_type NOT IN ('Credit', 'Refund')"),)),
        Say("idle-5", 10, "We call a resource idle on any day its average CPU stays under 5%.",
            "Idle share = days with avg CPU < 5%.",
            r"average\W+CPU\W+stays\W+under\W+5%|avg\W+CPU\W*<\W*5%|c\.avg_cpu_pct\s*<\s*5\b",
            (("idle", "c.avg_cpu_pct < 5"),), uses="idle"),
        Say("sprint-week", 15, "Weekly spend should follow our sprint calendar: sprints begin "
            "on a Thursday.", "Weeks are now Thursday to Wednesday.",
            r"sprints\W+begin\W+on\W+a\W+thursday|thursday\W+to\W+wednesday|"
            r"INTERVAL\s+'3 days'\)\s*\+\s*INTERVAL\s+'3 days'",
            (("week", THURSDAY_WEEK),), grain="week"),
        Say("prod-only", 40, "For the savings review we look at production accounts only; "
            "staging and dev already shut down at night.", "Scoped to prod (ao.env = 'prod').",
            r"production\W+accounts\W+only|scoped\W+to\W+prod\b|ao\.env\s*=\s*'prod'",
            ((W, "ao.env = 'prod'"),)),
        Say("thousands", 50, "What's behind the S3 jump in May - a new bucket? And going forward "
            "round spend to whole thousands of dollars, finance hates the noise.",
            "A new analytics bucket with versioning left on. Spend is now rounded to the "
            "nearest $1k.",
            r"whole\W+thousands\W+of\W+dollars|nearest\W+\$1k|ROUND\(SUM\([^()]*\),\s*-3\)",
            (("round", "-3"),), uses="alias"),
        Say("idle-10", 62, "SRE says the idle bar is too strict; treat a box as idle whenever "
            "its daily CPU averages below 10%.",
            "Idle now means avg CPU under 10% (c.avg_cpu_pct < 10).",
            r"daily\W+CPU\W+averages\W+below\W+10%|avg\W+CPU\W+under\W+10%|"
            r"c\.avg_cpu_pct\s*<\s*10\b",
            (("idle", "c.avg_cpu_pct < 10"),), replaces="idle-5", uses="idle"),
        Say("net-cost", 70, "The FinOps lead wants what we actually pay, so report net cost "
            "after the EDP discount.", "Spend now reads c.net_cost_usd.",
            r"net\W+cost\W+after\W+the\W+EDP\W+discount|c\.net_cost_usd\b",
            (("amount", "c.net_cost_usd"), ("alias", "net_spend")), replaces="amortized",
            uses="alias"),
        Say("all-envs", 78, "Pull the non-production environments back in - the CTO asked what "
            "dev boxes really cost us.", "Environment filter dropped; staging and dev are in.",
            r"non-production\W+environments\W+back\W+in|environment\W+filter\W+dropped",
            replaces="prod-only"),
    ),
)  # fmt: skip

SCENARIOS = (PHARMACY, ADMISSIONS, CLOUD)
