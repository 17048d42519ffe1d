"""Fidelity scenarios 13-15: health claims, energy metering, recruiting.

Written as a held-out set (scenarios_e.py and scenarios_f.py), without looking at the
instruction detector; the detector is now tuned on them, so they are tuning data
(`holdout=False`) and the held-out set is scenarios_i.py and scenarios_j.py. The wording of
every instruction and of its replacement is new (none repeats scenarios_a..d); some messages
carry two instructions (two Says at the same turn), some hide one inside a longer question.
"""

from __future__ import annotations

from memory_core.cli.demo_script import Turn as T
from memory_core.eval.corpus import Dim, Domain, Metric, Say, Scenario

W = "where"
PEAK = "EXTRACT(HOUR FROM r.read_at) BETWEEN {} AND {} AND EXTRACT(ISODOW FROM r.read_at) < 6"

CLAIMS = Scenario(
    name="health-claims",
    turns=46,
    holdout=False,
    domain=Domain(
        tables="claims cl\nJOIN members mb ON mb.id = cl.member_id",
        base=(("ts", "cl.submitted_at"), ("amount", "cl.paid_usd"), ("alias", "paid"),
              (W, "cl.submitted_at >= DATE '2025-01-01'")),
        dims=(Dim("plan type", "plan types", "mb.plan_type", ("HMO", "PPO", "EPO")),
              Dim("claim type", "claim types", "cl.claim_type",
                  ("professional", "institutional", "dental")),
              Dim("member state", "member states", "mb.state",
                  ("Ohio", "Texas", "Florida", "Georgia"))),
        metrics=(Metric("paid amount", "$money", "$alias"),
                 Metric("claim count", "COUNT(*)", "claims"),
                 Metric("average paid per claim", "ROUND(AVG($amount), 2)", "avg_paid"),
                 Metric("lapsed members", "COUNT(DISTINCT mb.id) FILTER (WHERE $lapsed)",
                        "lapsed_members")),
        dashboards=("Claims Overview", "Medical Cost Review"),
        table="claims",
        traps=(
            T("How many claims were denied last quarter, and why?",
              "8,410 were denied, mostly for missing prior authorisation.",
              ["SELECT denial_reason, COUNT(*) AS denials\nFROM claims\nWHERE status = 'denied'\n"
               "  AND submitted_at >= DATE '2025-07-01'\nGROUP BY 1\nORDER BY 2 DESC"]),
            T("What does the PBM charge us per pharmacy claim?",
              "An admin fee of $1.85 per pharmacy claim."),
            T("Is an outpatient visit usually cheaper than an inpatient stay?",
              "By far: the median outpatient claim is $310, an inpatient stay $14,900."),
            T("How long do members have to file a claim?",
              "A year after the visit for most plans."),
        ),
    ),
    says=(
        Say("no-denied", 2, "First thing: denied claims shouldn't show up anywhere in this.",
            "Understood - denied claims are left out of every query (cl.status <> 'denied').",
            r"denied\W+claims\W+(shouldn'?t|should\W+not|are\W+(left\W+out|excluded|out\b))|"
            r"(exclud\w*|leave\W+out|drop|without|ignor\w*|no)\W+(the\W+)?denied\W+claims|"
            r"cl\.status\s*<>\s*'denied'",
            ((W, "cl.status <> 'denied'"),)),
        Say("outpatient-only", 4, "For this piece only look at the outpatient side; inpatient "
            "stays are the hospital team's problem.",
            "Scoped to outpatient claims (cl.setting = 'outpatient').",
            r"only\W+(look\W+at\W+)?the\W+outpatient|outpatient(\W+(side|claims))?\W+only|"
            r"scoped\W+to\W+outpatient|cl\.setting\s*=\s*'outpatient'",
            ((W, "cl.setting = 'outpatient'"),)),
        Say("lapsed-45-days", 6, "Count a member as lapsed after 45 days without a claim.",
            "OK - lapsed means no claim in the last 45 days; 12,300 members qualify today.",
            r"lapsed.{0,60}45\W+days|"
            r"mb\.last_claim_at\s*<\s*CURRENT_DATE\s*-\s*INTERVAL\s+'45 days'",
            (("lapsed", "mb.last_claim_at < CURRENT_DATE - INTERVAL '45 days'"),),
            uses="lapsed"),
        Say("service-date", 9, "Bucket everything by date of service rather than submission "
            "date, since claims arrive weeks late.",
            "Periods now follow cl.service_date.",
            r"date\W+of\W+service|service\W+date|date_trunc\('\w+',\s*cl\.service_date\)",
            (("ts", "cl.service_date"),)),
        Say("dollars-k", 13, "Two things before the next chart: dollar figures as $k to one "
            "decimal place,", "From now on amounts show as $k, one decimal.",
            r"\$k\b.{0,30}one\W+decimal|thousands\W+of\W+dollars.{0,30}one\W+decimal|"
            r"/\s*1000\.0,\s*1\)",
            (("round", "k1"),)),
        Say("no-pharmacy", 13, "and pharmacy claims out of everything - they go through the PBM.",
            "Pharmacy claims are excluded too (cl.claim_type <> 'pharmacy').",
            r"pharmacy\W+claims\W+(are\W+)?(out\b|excluded|left\W+out)|(exclud\w*|leave\W+out|"
            r"drop|without|no)\W+(the\W+)?pharmacy\W+claims|cl\.claim_type\s*<>\s*'pharmacy'",
            ((W, "cl.claim_type <> 'pharmacy'"),)),
        Say("lapsed-60-days", 18,
            "Let's loosen lapsed to 60 days without a claim - 45 flags too many snowbirds.",
            "Updated: lapsed now means no claim for 60 days (9,870 members).",
            r"lapsed.{0,60}60\W+days|"
            r"mb\.last_claim_at\s*<\s*CURRENT_DATE\s*-\s*INTERVAL\s+'60 days'",
            (("lapsed", "mb.last_claim_at < CURRENT_DATE - INTERVAL '60 days'"),),
            replaces="lapsed-45-days", uses="lapsed"),
        Say("all-settings", 21, "We're back to all care settings; the hospital team wants "
            "inpatient in the same view.",
            "The setting filter is gone - inpatient and outpatient claims together.",
            r"all\W+care\W+settings|setting\W+filter\W+is\W+gone", replaces="outpatient-only"),
        Say("no-small-claims", 27,
            "Anything paid under $25 is admin noise; skip those claims when you total things up.",
            "Claims paid under $25 are skipped (cl.paid_usd >= 25).",
            r"under\W+\$?25\b.{0,40}(noise|skip\w*|exclud\w*)|cl\.paid_usd\s*>=\s*25\b",
            ((W, "cl.paid_usd >= 25"),)),
    ),
)  # fmt: skip

GRID = Scenario(
    name="energy-metering",
    turns=53,
    holdout=False,
    domain=Domain(
        tables="readings r\nJOIN meters m ON m.id = r.meter_id",
        base=(("ts", "r.read_at"), ("amount", "r.energy_kwh / 1000.0"), ("alias", "mwh"),
              (W, "r.read_at >= DATE '2025-01-01'")),
        dims=(Dim("tariff", "tariffs", "m.tariff", ("standard", "time-of-use", "night saver")),
              Dim("grid region", "grid regions", "m.grid_region",
                  ("Dublin", "Cork", "Galway", "Limerick")),
              Dim("customer class", "customer classes", "m.customer_class",
                  ("residential", "SME", "industrial"))),
        metrics=(Metric("consumption", "$money", "$alias"),
                 Metric("meter count", "COUNT(DISTINCT m.id)", "meters"),
                 Metric("average reading", "ROUND(AVG($amount), 2)", "avg_reading"),
                 Metric("peak share", "ROUND(100.0 * SUM($amount) FILTER (WHERE $peak) / "
                        "NULLIF(SUM($amount), 0), 1)", "peak_share_pct")),
        dashboards=("Grid Load", "Retail Energy"),
        table="meters",
        traps=(
            T("Which pilot sites got the new firmware in May?",
              "Eleven pilot sites, all around Galway.",
              ["SELECT site_id, firmware_version\nFROM meters\nWHERE is_pilot\n"
               "  AND firmware_updated_at >= DATE '2025-05-01'"]),
            T("How many reads were estimated last month?",
              "4.2% of reads were estimated, mostly on the older meters."),
            T("When is the evening peak on a cold day?", "Demand usually tops out around 18:30."),
            T("Do business customers pay a standing charge?",
              "Yes, SMEs pay a daily standing charge of 0.72 euro."),
        ),
    ),
    says=(
        Say("kwh-not-mwh", 3, "Report kWh, not MWh - the retail team thinks in kilowatt-hours.",
            "Switched: energy is now in kWh (SUM(r.energy_kwh) AS kwh).",
            r"kWh,?\W+not\W+MWh|(energy|consumption|figures|numbers)\W+(is\W+)?(now\W+)?in\W+"
            r"kWh\b|kilowatt(-|\W)hours|AS\s+kwh\b",
            (("amount", "r.energy_kwh"), ("alias", "kwh"))),
        Say("no-pilot-sites", 5, "From here on, no pilot sites. They run experimental firmware "
            "and the reads jump around.",
            "Pilot sites are out of every query now (NOT m.is_pilot).",
            r"no\W+pilot\W+sites|pilot\W+sites\W+are\W+(out\b|excluded|left\W+out)|"
            r"(exclud\w*|leave\W+out|drop|without|ignor\w*)\W+(the\W+|all\W+)?pilot\W+sites|"
            r"NOT\s+m\.is_pilot",
            ((W, "NOT m.is_pilot"),)),
        Say("peak-4-to-7", 8, "Peak is 4pm to 7pm on weekdays; anything else counts as off-peak.",
            "Noted: peak = weekday reads from 16:00 to 19:00.",
            r"peak.{0,40}(\b4\W*pm|16:00).{0,20}(\b7\W*pm|19:00)|BETWEEN\s+16\s+AND\s+18",
            (("peak", PEAK.format(16, 18)),), uses="peak"),
        Say("irish-time", 11, "The reads arrive in UTC. Convert them to Irish local time so the "
            "evening peak lines up.", "Timestamps are now converted to Europe/Dublin.",
            r"irish\W+(local\W+)?time|Europe/Dublin", (("tz", "Europe/Dublin"),)),
        Say("residential-only", 14, "Let's narrow this to households: residential meters only "
            "until the tariff review is done.",
            "Narrowed to m.customer_class = 'residential'.",
            r"narrow\w*\W+(this\W+|it\W+)?to\W+(households|residential)|residential\W+meters\W+"
            r"only|only\W+residential\W+meters|m\.customer_class\s*=\s*'residential'",
            ((W, "m.customer_class = 'residential'"),)),
        Say("whole-kwh", 19,
            "Can you drop the fractions? Whole kWh is precise enough for this audience.",
            "Consumption is rounded to whole kWh now.",
            r"whole\W+kWh|drop\W+the\W+fractions|ROUND\(SUM\([^()]*\)\)", (("round", "0"),)),
        Say("peak-5-to-8", 23,
            "Heads up, the network operator moved the peak window: it's 5pm to 8pm now.",
            "Updated: peak = weekday reads from 17:00 to 20:00.",
            r"peak.{0,40}(\b5\W*pm|17:00).{0,20}(\b8\W*pm|20:00)|BETWEEN\s+17\s+AND\s+19",
            (("peak", PEAK.format(17, 19)),), replaces="peak-4-to-7", uses="peak"),
        Say("businesses-back", 27,
            "Bring businesses back into scope - SME and industrial meters count again.",
            "Customer-class filter removed; all customer classes are in.",
            r"businesses\W+back|SME\W+and\W+industrial\W+meters\W+count|"
            r"all\W+customer\W+classes",
            replaces="residential-only"),
        Say("actual-reads-only", 33, "Is the Cork dip real? Either way, from now on treat "
            "estimated reads as missing - I only trust actual reads.",
            "The Cork dip is real: two large sites closed. Estimated reads are excluded now "
            "(NOT r.is_estimated).",
            r"trust\W+actual\W+reads|estimated\W+reads\W+(as\W+missing|are\W+excluded)|"
            r"NOT\s+r\.is_estimated",
            ((W, "NOT r.is_estimated"),)),
    ),
)  # fmt: skip

HIRING = Scenario(
    name="hr-recruiting",
    turns=64,
    holdout=False,
    domain=Domain(
        tables="applications ap\nJOIN requisitions rq ON rq.id = ap.requisition_id",
        base=(("ts", "ap.applied_at"), ("amount", "ap.offer_salary_usd"),
              ("alias", "offer_salary"), (W, "ap.applied_at >= DATE '2025-01-01'")),
        dims=(Dim("department", "departments", "rq.department",
                  ("Engineering", "Sales", "Finance", "Operations")),
              Dim("candidate source", "candidate sources", "ap.source",
                  ("job board", "referral", "agency", "careers page")),
              Dim("office", "offices", "rq.office", ("Zurich", "Geneva", "Lausanne")),
              Dim("seniority", "seniority levels", "rq.level", ("junior", "mid-level", "senior"))),
        metrics=(Metric("applications", "COUNT(*)", "applications"),
                 Metric("offer salaries", "$money", "$alias"),
                 Metric("hires", "COUNT(*) FILTER (WHERE ap.status = 'hired')", "hires"),
                 Metric("time to hire", "ROUND(AVG($tth))", "avg_days_to_hire"),
                 Metric("offer acceptance rate", "ROUND(100.0 * AVG(($accepted)::int), 1)",
                        "acceptance_pct")),
        dashboards=("Hiring Funnel", "Headcount Plan"),
        table="applications",
        traps=(
            T("How many contractors did we bring on through agencies last year?",
              "47 contractors, 31 of them via agencies.",
              ["SELECT COUNT(*) AS contractors\nFROM applications ap\n"
               "JOIN requisitions rq ON rq.id = ap.requisition_id\n"
               "WHERE rq.contract_type = 'contractor' AND ap.status = 'hired'"]),
            T("What exchange rate from francs to euros does the budget use?",
              "The budget uses 0.95 euro per franc."),
            T("Did Q1 have fewer applications than Q2?",
              "Yes, Q1 had 18% fewer, partly because the old ATS lost some."),
            T("How do internal transfers get approved?",
              "The hiring manager and the HR business partner both sign off in Workday."),
        ),
    ),
    says=(
        Say("permanent-only", 2,
            "Contractors are out of scope for this - permanent roles only, please.",
            "OK, only permanent requisitions from now on (rq.contract_type = 'permanent').",
            r"contractors\W+are\W+out\W+of\W+scope|permanent\W+roles\W+only|only\W+permanent\W+"
            r"(roles|requisitions)|rq\.contract_type\s*=\s*'permanent'",
            ((W, "rq.contract_type = 'permanent'"),)),
        Say("salaries-chf", 5, "Numbers should be in CHF; salaries are set in francs and that's "
            "what the comp committee reads.", "Salaries now come from offer_salary_chf.",
            r"numbers\W+should\W+be\W+in\W+CHF|\bin\W+CHF\b|swiss\W+francs|offer_salary_chf",
            (("amount", "ap.offer_salary_chf"),)),
        Say("time-to-hire", 8, "Time to hire runs from the day the req opens to the day the "
            "offer is signed, in calendar days.",
            "Time to hire = offer_signed_at::date - opened_at::date.",
            r"time\W+to\W+hire.{0,60}(req|requisition)\W+opens.{0,40}signed|time\W+to\W+hire\W*="
            r"\W*offer_signed_at|ap\.offer_signed_at::date\s*-\s*rq\.opened_at::date",
            (("tth", "ap.offer_signed_at::date - rq.opened_at::date"),), uses="tth"),
        Say("from-april", 12, "Ignore everything before April 2025 - Q1 predates the new ATS and "
            "the data is patchy.",
            "Done: applications from 1 April 2025 on (ap.applied_at >= DATE '2025-04-01').",
            r"(ignor\w*|exclud\w*|leave\W+out|skip|drop)\W+(anything\W+|everything\W+)?before\W+"
            r"april\W+2025|from\W+(1\W+)?april\W+2025\W+on|"
            r"ap\.applied_at\s*>=\s*DATE\s+'2025-04-01'",
            ((W, "ap.applied_at >= DATE '2025-04-01'"),)),
        Say("accepted-14-days", 22, "Two rules for the funnel from now on: an offer only counts "
            "as accepted if the candidate said yes within 14 days,",
            "Acceptance now needs accepted_at within 14 days of the offer.",
            r"accept\w*.{0,60}within\W+(14|fourteen)\W+days|"
            r"ap\.offered_at\s*\+\s*INTERVAL\s+'14 days'",
            (("accepted", "ap.accepted_at <= ap.offered_at + INTERVAL '14 days'"),),
            uses="accepted"),
        Say("no-internal-transfers", 22, "and internal transfers don't go in the funnel at all.",
            "Internal transfers are excluded (NOT ap.is_internal).",
            r"internal\W+transfers\W+(don'?t\W+go|are\W+(excluded|out\b))|(no|exclud\w*|leave\W+"
            r"out|drop|without|ignor\w*)\W+(the\W+)?internal\W+transfers|NOT\s+ap\.is_internal",
            ((W, "NOT ap.is_internal"),)),
        Say("q1-back", 28, "Let's drop the Q1 cutoff, the ATS team backfilled January to March.",
            "Done - January to March are back in the series.",
            r"drop\W+the\W+Q1\W+cutoff|january\W+to\W+march\W+(are\W+)?back|"
            r"backfilled\W+january\W+to\W+march",
            replaces="from-april"),
        Say("salaries-eur", 34, "For the group pack salaries need to be euros, not francs.",
            "Switched salaries to EUR (offer_salary_eur).",
            r"euros,?\W+not\W+francs|salaries\W+(need\W+to\W+be\W+euros|to\W+EUR)|"
            r"offer_salary_eur",
            (("amount", "ap.offer_salary_eur"),), replaces="salaries-chf"),
        Say("contractors-back", 39, "Stop leaving out contractors - the board wants the whole "
            "hiring effort, fixed-term people included.",
            "Contract roles are counted again next to permanent ones.",
            r"stop\W+leaving\W+out\W+contractors|contract\W+roles\W+are\W+counted\W+again",
            replaces="permanent-only"),
    ),
)  # fmt: skip

SCENARIOS = (CLAIMS, GRID, HIRING)
