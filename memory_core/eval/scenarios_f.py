"""Fidelity scenarios 16-18: insurance policies, online courses, food delivery.

Written blind to the instruction detector like scenarios_e.py, and tuning data since, like it.
"""

from __future__ import annotations

from memory_core.cli.demo_script import Turn as T
from memory_core.eval.corpus import Dim, Domain, Metric, Say, Scenario

W = "where"

POLICIES = Scenario(
    name="insurance-policies",
    turns=76,
    holdout=False,
    domain=Domain(
        tables="policies po\nJOIN policyholders ph ON ph.id = po.holder_id",
        base=(("ts", "po.bound_at"), ("amount", "po.written_premium_cad"),
              ("alias", "written_premium"), (W, "po.bound_at >= DATE '2024-07-01'")),
        dims=(Dim("line of business", "lines of business", "po.line",
                  ("motor", "home", "travel", "pet")),
              Dim("broker", "brokers", "po.broker", ("Aon", "Marsh", "WTW", "direct")),
              Dim("province", "provinces", "ph.province",
                  ("Ontario", "Quebec", "Alberta", "British Columbia"))),
        metrics=(Metric("premium", "$money", "$alias"),
                 Metric("policies bound", "COUNT(*)", "policies"),
                 Metric("average premium", "ROUND(AVG($amount), 2)", "avg_premium"),
                 Metric("loss ratio", "$loss_ratio", "loss_ratio_pct"),
                 Metric("retained policies", "COUNT(*) FILTER (WHERE $retained)",
                        "retained_policies")),
        dashboards=("Underwriting Review", "Broker League"),
        table="policies",
        traps=(
            T("How long is the cooling-off period in Quebec?",
              "Ten days in Quebec, 14 in the other provinces."),
            T("What did pet claims cost us last year?",
              "About 6.1 million dollars across 21,000 claims."),
            T("Is the Alberta portfolio still being cleaned up?",
              "Yes, about 1,900 policies still have address issues."),
            T("How many policies lapsed at renewal in June?",
              "1,240 policies lapsed at renewal in June.",
              ["SELECT COUNT(*) AS lapsed\nFROM policies\nWHERE renewed_at IS NULL\n"
               "  AND expires_at >= DATE '2025-06-01' AND expires_at < DATE '2025-07-01'"]),
        ),
    ),
    says=(
        Say("earned-premium", 3,
            "Use earned premium throughout; written premium overstates the books we just started.",
            "Premium now means earned premium (earned_premium_cad).",
            r"earned\W+premium\W+throughout|use\W+earned\W+premium|premium\W+now\W+means\W+"
            r"earned|AS\s+earned_premium\b",
            (("amount", "po.earned_premium_cad"), ("alias", "earned_premium"))),
        Say("no-cooling-off", 6, "A policy cancelled inside the cooling-off period never really "
            "existed, so keep those out.",
            "Cooling-off cancellations are excluded (NOT po.cancelled_in_cooling_off).",
            r"cooling(-|\W)off.{0,60}(keep\W+(those\W+|them\W+)?out|exclud\w*|left\W+out)|"
            r"NOT\s+po\.cancelled_in_cooling_off",
            ((W, "NOT po.cancelled_in_cooling_off"),)),
        Say("loss-ratio", 9,
            "Loss ratio is incurred claims over earned premium, as a percent with one decimal.",
            "Loss ratio = 100 * incurred / earned, one decimal.",
            r"loss\W+ratio.{0,40}incurred|SUM\(po\.incurred_claims_cad\)",
            (("loss_ratio", "ROUND(100.0 * SUM(po.incurred_claims_cad) / "
              "NULLIF(SUM(po.earned_premium_cad), 0), 1)"),), uses="loss_ratio"),
        Say("retained-no-lapse", 16, "How is retention trending this year? And a policy only "
            "counts as retained if it renewed with no lapse in cover.",
            "Retention is steady at about 81%. Retained now means renewed on or before expiry "
            "(po.renewed_at <= po.expires_at).",
            r"retain\w*.{0,60}renew\w*.{0,40}(no\W+lapse|before\W+expiry|without\W+a\W+"
            r"(lapse|gap))|po\.renewed_at\s*<=\s*po\.expires_at",
            (("retained", "po.renewed_at <= po.expires_at"),), uses="retained"),
        Say("ontario-quebec", 21,
            "Let's keep it to Ontario and Quebec until the western portfolio is cleaned up.",
            "Restricted to ph.province IN ('Ontario', 'Quebec').",
            r"keep\W+it\W+to\W+ontario\W+and\W+quebec|(restrict\w*|limit\w*|scop\w*)\W+to\W+"
            r"ontario\W+and\W+quebec|ontario\W+and\W+quebec\W+only|"
            r"ph\.province\s+IN\s+\('Ontario',\s*'Quebec'\)",
            ((W, "ph.province IN ('Ontario', 'Quebec')"),)),
        Say("no-pet", 27, "Pet insurance is run by a partner, so leave it out from now on.",
            "Pet policies are excluded (po.line <> 'pet').",
            r"pet\W+insurance.{0,40}leave\W+it\W+out|(exclud\w*|leave\W+out|drop|without|"
            r"ignor\w*)\W+(the\W+)?pet\W+(insurance|policies|line)|pet\W+policies\W+are\W+"
            r"excluded|po\.line\s*<>\s*'pet'",
            ((W, "po.line <> 'pet'"),)),
        Say("retained-grace", 33,
            "New retention rule: a renewal up to 30 days after expiry still counts as retained.",
            "Retained now allows a 30-day grace period after expiry.",
            r"30(-|\W)day\W+grace|renewal\W+up\W+to\W+30\W+days\W+after\W+expiry|"
            r"po\.renewed_at\s*-\s*po\.expires_at\s*<=\s*INTERVAL\s+'30 days'",
            (("retained", "po.renewed_at - po.expires_at <= INTERVAL '30 days'"),),
            replaces="retained-no-lapse", uses="retained"),
        Say("west-back", 45,
            "The western book is clean now, so Alberta and British Columbia come back in.",
            "Province filter removed - all provinces are back.",
            r"alberta\W+and\W+(BC|british\W+columbia)\W+(come\W+|are\W+)?back|all\W+provinces",
            replaces="ontario-quebec"),
        Say("fiscal-november", 52, "Quarters should follow our financial year, which begins on "
            "1 November - that's how the reinsurer reports.",
            "Quarters now follow the November financial year (start_month => 11).",
            r"financial\W+year.{0,30}(begins|starts)\W+(on\W+)?(1\W+)?november|november\W+"
            r"financial\W+year|start_month\s*=>\s*11",
            (("calendar", "fiscal:11"),), grain="quarter"),
    ),
)  # fmt: skip

COURSES = Scenario(
    name="edtech-courses",
    turns=89,
    holdout=False,
    domain=Domain(
        tables="enrolments en\nJOIN courses co ON co.id = en.course_id",
        base=(("ts", "en.enrolled_at"), ("amount", "en.fee_usd"), ("alias", "fee_revenue"),
              (W, "en.enrolled_at >= DATE '2025-01-01'")),
        dims=(Dim("subject", "subjects", "co.subject",
                  ("Data Science", "Design", "Languages", "Marketing")),
              Dim("delivery mode", "delivery modes", "co.mode", ("self-paced", "cohort", "live")),
              Dim("learner country", "learner countries", "en.country", ("IN", "NG", "BR", "PH"))),
        metrics=(Metric("enrolments", "COUNT(*)", "enrolments"),
                 Metric("fee revenue", "$money", "$alias"),
                 Metric("completion rate", "ROUND(100.0 * AVG(($completed)::int), 1)",
                        "completion_pct"),
                 Metric("active learners",
                        "COUNT(DISTINCT en.learner_id) FILTER (WHERE $engaged)",
                        "active_learners"),
                 Metric("average quiz score", "ROUND(AVG(en.quiz_avg), 1)", "avg_quiz")),
        dashboards=("Learning Outcomes", "Growth Weekly"),
        table="enrolments",
        traps=(
            T("How many free auditors upgraded to the paid track last month?",
              "2,310 auditors upgraded, mostly in Data Science.",
              ["SELECT COUNT(*) AS upgrades\nFROM enrolments\n"
               "WHERE upgraded_from = 'audit' AND upgraded_at >= DATE '2025-09-01'"]),
            T("Do certificates help learners get jobs?",
              "In the alumni survey 41% credit the certificate for an interview."),
            T("How big is the corporate academy business?",
              "Nine corporate academy contracts, about 14,000 seats."),
            T("What rupee to dollar rate do we budget with?", "83 rupees to the dollar."),
            T("Are cohort courses harder to sell?",
              "They convert 30% worse from the landing page but finish far more often."),
        ),
    ),
    says=(
        Say("no-free-auditors", 2,
            "Keep free auditors out of the numbers - they never pay and hardly ever finish.",
            "Free audit-track enrolments are excluded (en.track <> 'audit').",
            r"(keep|leave)\W+(the\W+)?free\W+audit\w*\W+out|free\W+audit\S*.{0,30}(excluded|"
            r"out\W+of\W+the)|(exclud\w*|drop|without|ignor\w*)\W+(the\W+)?free\W+audit|"
            r"en\.track\s*<>\s*'audit'",
            ((W, "en.track <> 'audit'"),)),
        Say("completed-80-pct", 5, "I'd call a course completed once the learner has done 80% "
            "of the modules; certificates are optional.",
            "Completion = modules_done >= 80% of module_count.",
            r"complet\w*.{0,60}80\s*%|en\.modules_done\s*>=\s*0\.8\s*\*",
            (("completed", "en.modules_done >= 0.8 * co.module_count"),), uses="completed"),
        Say("active-learner", 12, "Active learner = at least one lesson finished in the past 14 "
            "days; just opening the app doesn't count.",
            "Active learners now need a lesson in the last 14 days.",
            r"active\W+learners?.{0,60}lesson.{0,30}14\W+days|"
            r"en\.last_lesson_at\s*>=\s*CURRENT_DATE\s*-\s*INTERVAL\s+'14 days'",
            (("engaged", "en.last_lesson_at >= CURRENT_DATE - INTERVAL '14 days'"),),
            uses="engaged"),
        Say("fees-inr", 17, "From now on fees in rupees please - finance closes the books in INR.",
            "Fees now come from fee_inr.",
            r"fees\W+in\W+rupees|\bin\W+INR\b|en\.fee_inr", (("amount", "en.fee_inr"),)),
        Say("cohort-only", 23, "Two more rules: only the cohort courses,",
            "Scoped to co.mode = 'cohort'.",
            r"only\W+(the\W+)?cohort\W+courses|cohort\W+courses\W+only|co\.mode\s*=\s*'cohort'",
            ((W, "co.mode = 'cohort'"),)),
        Say("no-corporate-academy", 23,
            "and nothing from the corporate academy - those are B2B seats we don't market.",
            "Corporate academy enrolments are out (NOT en.is_b2b).",
            r"(nothing|none)\W+from\W+the\W+corporate\W+academy|corporate\W+academy\W+"
            r"(contracts\W+|enrolments\W+)?(are\W+)?(excluded|out)\b|NOT\s+en\.is_b2b",
            ((W, "NOT en.is_b2b"),)),
        Say("completed-certificate", 35, "Make completion mean a certificate was issued; the "
            "module-share rule let too many people through.",
            "Completed now means en.certificate_issued_at IS NOT NULL.",
            r"complet\w*.{0,40}certificate\W+(was\W+|is\W+)?issued|"
            r"en\.certificate_issued_at\s+IS\s+NOT\s+NULL",
            (("completed", "en.certificate_issued_at IS NOT NULL"),),
            replaces="completed-80-pct", uses="completed"),
        Say("auditors-back", 50,
            "Auditors should be counted again; we're reporting reach to the foundation now.",
            "Audit-track enrolments are back in.",
            r"auditors\W+(should\W+be\W+)?counted\W+again|audit(-|\W)track\W+enrolments\W+are\W+"
            r"back",
            replaces="no-free-auditors"),
        Say("all-modes", 58,
            "Self-paced and live courses belong in the picture again, so all delivery modes.",
            "Mode filter removed.",
            r"all\W+delivery\W+modes|self(-|\W)paced\W+and\W+live\W+courses\W+belong",
            replaces="cohort-only"),
    ),
)  # fmt: skip

DELIVERY = Scenario(
    name="food-delivery",
    turns=105,
    holdout=False,
    domain=Domain(
        tables="deliveries dl\nJOIN restaurants rs ON rs.id = dl.restaurant_id",
        base=(("ts", "dl.placed_at"), ("amount", "dl.order_value_eur"), ("alias", "order_value"),
              ("eta", "EXTRACT(EPOCH FROM dl.delivered_at - dl.placed_at) / 60"),
              (W, "dl.placed_at >= DATE '2025-01-01'")),
        dims=(Dim("city", "cities", "rs.city", ("Madrid", "Barcelona", "Valencia", "Seville")),
              Dim("cuisine", "cuisines", "rs.cuisine", ("pizza", "sushi", "burgers", "tapas")),
              Dim("courier type", "courier types", "dl.courier_type", ("bike", "scooter", "car")),
              Dim("meal slot", "meal slots", "dl.slot", ("breakfast", "lunch", "dinner"))),
        metrics=(Metric("revenue", "$money", "$alias"),
                 Metric("orders", "COUNT(*)", "orders"),
                 Metric("delivery time", "ROUND(AVG($eta), 1)", "avg_delivery_min"),
                 Metric("late deliveries", "COUNT(*) FILTER (WHERE $late)", "late_deliveries"),
                 Metric("courier pay", "SUM(dl.courier_fee_eur)", "courier_pay")),
        dashboards=("City Ops", "Weekly Trading"),
        table="deliveries",
        traps=(
            T("What share of orders are pickup these days?", "Pickup is 9% of orders, up from 6%.",
              ["SELECT ROUND(100.0 * AVG((fulfilment = 'pickup')::int), 1) AS pickup_pct\n"
               "FROM deliveries\nWHERE placed_at >= CURRENT_DATE - 30"]),
            T("How late was the worst delivery last weekend?",
              "One Barcelona order arrived 74 minutes after its ETA."),
            T("Is Seville's volume still tiny?", "About 600 orders a week, a tenth of Madrid's."),
            T("Do couriers get paid extra when it rains?", "Yes, a 1.50 euro rain bonus per drop."),
            T("How fast does a restaurant usually accept an order?",
              "Within 90 seconds for 80% of orders."),
        ),
    ),
    says=(
        Say("no-pickup", 2,
            "Pickup orders aren't deliveries, so they don't belong in any of these numbers.",
            "Pickup is excluded from now on (dl.fulfilment <> 'pickup').",
            r"pickup\W+orders\W+(aren'?t|are\W+not|don'?t\W+belong|are\W+excluded)|(exclud\w*|"
            r"drop|without|ignor\w*|leave\W+out)\W+(the\W+)?pickup\W+orders|"
            r"dl\.fulfilment\s*<>\s*'pickup'",
            ((W, "dl.fulfilment <> 'pickup'"),)),
        Say("late-10-min", 4, "Late means more than 10 minutes past the ETA we showed the "
            "customer.", "Late = delivered_at > promised_eta + 10 minutes.",
            r"late.{0,40}(more\W+than\W+)?\b10\W+minutes\W+(past|after|beyond)|late\W*=\W*"
            r"delivered_at\W*>\W*promised_eta\W*\+\W*10\b|INTERVAL\s+'10 minutes'",
            (("late", "dl.delivered_at > dl.promised_eta + INTERVAL '10 minutes'"),),
            uses="late"),
        Say("madrid-barcelona", 7, "Why does Valencia jump around so much? Actually, let's keep "
            "to Madrid and Barcelona for now, the smaller cities only just launched.",
            "Valencia is still small, so a few big office orders swing it. Scoped to Madrid and "
            "Barcelona (rs.city IN ('Madrid', 'Barcelona')).",
            r"keep\W+to\W+madrid\W+and\W+barcelona|(only|scoped\W+to)\W+madrid\W+and\W+"
            r"barcelona|madrid\W+and\W+barcelona\W+only|"
            r"rs\.city\s+IN\s+\('Madrid',\s*'Barcelona'\)",
            ((W, "rs.city IN ('Madrid', 'Barcelona')"),)),
        Say("delivery-time", 11, "Delivery time should run from when the restaurant accepts the "
            "order to the courier marking it delivered - not from checkout.",
            "Delivery time now = delivered_at - accepted_at, in minutes.",
            r"delivery\W+time.{0,60}restaurant\W+accepts|dl\.delivered_at\s*-\s*dl\.accepted_at",
            (("eta", "EXTRACT(EPOCH FROM dl.delivered_at - dl.accepted_at) / 60"),),
            uses="eta"),
        Say("commission", 21, "What we actually earn is the commission, so show commission, not "
            "order value, wherever there's money.",
            "Money columns now use dl.commission_eur AS commission.",
            r"commission,?\W+not\W+order\W+value|AS\s+commission\b|dl\.commission_eur",
            (("amount", "dl.commission_eur"), ("alias", "commission"))),
        Say("late-15-min", 28, "Ops relaxed the lateness rule: fifteen minutes of slack before "
            "an order counts as late.",
            "Late now means more than 15 minutes past the promised ETA.",
            r"(fifteen|15)\W+minutes\W+of\W+slack|late.{0,60}\b15\W+minutes|"
            r"INTERVAL\s+'15 minutes'",
            (("late", "dl.delivered_at > dl.promised_eta + INTERVAL '15 minutes'"),),
            replaces="late-10-min", uses="late"),
        Say("spanish-time", 40, "Show times in Spanish local time; the exports come out in UTC "
            "and lunch looks like it's at 11.", "Timestamps are now in Europe/Madrid.",
            r"spanish\W+(local\W+)?time|Europe/Madrid", (("tz", "Europe/Madrid"),)),
        Say("all-cities", 60,
            "We're back to all cities - Valencia and Seville have enough volume now.",
            "City filter removed; all four cities are in.",
            r"back\W+to\W+all\W+cities|all\W+(four\W+)?cities", replaces="madrid-barcelona"),
        Say("pickup-back", 72, "Include pickup orders from here on; the marketplace team counts "
            "them as orders too.", "Pickup orders are counted again.",
            r"includ\w*\W+(the\W+)?pickup\W+orders|pickup\W+orders\W+are\W+counted\W+again",
            replaces="no-pickup"),
    ),
)  # fmt: skip

SCENARIOS = (POLICIES, COURSES, DELIVERY)
