"""Held-out fidelity scenarios 25-27: airline operations, real-estate listings, telecom churn.

Held-out (scenarios_i.py and scenarios_j.py): written without looking at the instruction
detector, after scenarios_a..h became tuning data, and never tuned against; the report gives
their figures on their own. The wording is new (nothing repeats scenarios_a..h): conventions
given with a reason, definitions as a sentence, a colon or "X = A / B", two instructions in one
message, one inside a longer question, a stakeholder's wish, units, currencies, rounding and
calendars, restrictions lifted, and replacements that name their subject differently.
"""

from __future__ import annotations

from memory_core.cli.demo_script import Turn as T
from memory_core.eval.corpus import Dim, Domain, Metric, Say, Scenario

W = "where"
OTP = "ROUND(100.0 * AVG((f.departure_delay_min <= {})::int), 1)"
PPA = "ROUND(SUM($amount) / NULLIF(SUM(l.floor_area_{}), 0))"
CHURN = "ROUND(100.0 * AVG((sb.days_inactive >= {})::int), 2)"

AIRLINE = Scenario(
    name="airline-operations",
    turns=47,
    holdout=True,
    domain=Domain(
        tables="flights f\nJOIN airports a ON a.code = f.origin",
        base=(("ts", "f.scheduled_departure"), ("amount", "f.fuel_cost_usd"),
              ("alias", "fuel_cost"), (W, "f.scheduled_departure >= DATE '2025-01-01'")),
        dims=(Dim("base", "bases", "a.base_name", ("Dublin", "Cork", "Shannon")),
              Dim("aircraft type", "aircraft types", "f.aircraft_type",
                  ("A320neo", "A321LR", "ATR 72")),
              Dim("market", "markets", "f.market", ("UK", "Continental", "Transatlantic"))),
        metrics=(Metric("flights", "COUNT(*)", "flights"),
                 Metric("fuel cost", "$money", "$alias"),
                 Metric("on-time performance", "$otp", "otp_pct"),
                 Metric("average delay", "ROUND(AVG(f.departure_delay_min), 1)", "avg_delay_min"),
                 Metric("load factor",
                        "ROUND(100.0 * SUM(f.passengers) / NULLIF(SUM(f.seats), 0), 1)",
                        "load_factor_pct")),
        dashboards=("Ops Daily", "Network Review"),
        table="flights",
        traps=(
            T("How many flights did we cancel during the September storm?",
              "46 cancellations over two days, mostly Shannon rotations.",
              ["SELECT a.base_name, COUNT(*) AS cancelled\nFROM flights f\n"
               "JOIN airports a ON a.code = f.origin\nWHERE f.status = 'cancelled'\n"
               "  AND f.scheduled_departure >= DATE '2025-09-01'\nGROUP BY 1"]),
            T("What's the minimum turnaround for an ATR at Cork?",
              "25 minutes on paper; in practice closer to 30."),
            T("Do we still rent the spare A320 from the lessor over Christmas?",
              "Yes, dry-leased for six weeks and flown by our own crews."),
            T("Which airport charges us the highest landing fees?",
              "Heathrow, by far, especially for the morning slots."),
        ),
    ),
    says=(
        Say("no-positioning", 2, "Positioning flights carry nobody and wreck every per-seat "
            "number, so take them out of all of this.",
            "Done - positioning legs are out (NOT f.is_positioning).",
            r"positioning\W+(flights|legs).{0,80}(take\W+them\W+out|are\W+out)|"
            r"NOT\s+f\.is_positioning",
            ((W, "NOT f.is_positioning"),)),
        Say("otp-d15", 4, "When I say on time I mean off the gate within 15 minutes of "
            "schedule - the usual D15.",
            "Understood: on-time performance uses D15 (departure_delay_min <= 15).",
            r"within\W+15\W+minutes\W+of\W+schedule|\bD15\b|f\.departure_delay_min\s*<=\s*15\b",
            (("otp", OTP.format(15)),), uses="otp"),
        Say("dublin-time", 6, "Schedules are stored in UTC. Ops plans on Dublin wall-clock "
            "time, so convert before you bucket anything.",
            "Timestamps are converted to Europe/Dublin before bucketing.",
            r"dublin\W+wall-clock\W+time|Europe/Dublin", (("tz", "Europe/Dublin"),)),
        Say("fuel-eur", 9, "Two things for the fuel numbers. The CFO reads them in euros, so "
            "take the EUR column,", "Fuel now comes from f.fuel_cost_eur,",
            r"CFO\W+reads\W+them\W+in\W+euros|f\.fuel_cost_eur\b",
            (("amount", "f.fuel_cost_eur"), ("alias", "fuel_cost_eur")), uses="alias"),
        Say("fuel-k1", 9, "and quote them as thousands with a single decimal.",
            "shown as EUR thousands to one decimal place.",
            r"thousands\W+with\W+a\W+single\W+decimal|EUR\W+thousands\W+to\W+one\W+decimal|"
            r"/\s*1000\.0,\s*1\)",
            (("round", "k1"),)),
        Say("summer-only", 12, "This review is about the summer schedule only - late March to "
            "late October, IATA season S25.",
            "Scoped to the summer season (f.season = 'S25').",
            r"summer\W+schedule\W+only|scoped\W+to\W+the\W+summer\W+season|"
            r"f\.season\s*=\s*'S25'",
            ((W, "f.season = 'S25'"),)),
        Say("no-wet-lease", 18, "Why did Cork's turnarounds slip in August? And from here on, "
            "leave out whatever the ACMI partner flies for us on wet lease - those crews and "
            "aircraft aren't ours.",
            "Mostly late inbound aircraft from Heathrow. Wet-leased flights are now excluded "
            "(NOT f.is_wet_lease).",
            r"leave\W+out\W+whatever\W+the\W+ACMI\W+partner|wet-leased\W+flights\W+are\W+now\W+"
            r"excluded|NOT\s+f\.is_wet_lease",
            ((W, "NOT f.is_wet_lease"),)),
        Say("otp-strict", 20, "The COO wants punctuality judged strictly: a departure is "
            "punctual only if it pushes back at or before the scheduled time.",
            "On-time performance now means zero minutes late (departure_delay_min <= 0).",
            r"pushes\W+back\W+at\W+or\W+before\W+the\W+scheduled|zero\W+minutes\W+late|"
            r"f\.departure_delay_min\s*<=\s*0\b",
            (("otp", OTP.format(0)),), replaces="otp-d15", uses="otp"),
        Say("full-year", 22, "Winter flying has to be in the picture as well now; open it up "
            "to the whole year.", "Season filter dropped - all twelve months are in.",
            r"winter\W+flying\W+has\W+to\W+be\W+in|open\W+it\W+up\W+to\W+the\W+whole\W+year|"
            r"season\W+filter\W+dropped",
            replaces="summer-only"),
    ),
)  # fmt: skip

LISTINGS = Scenario(
    name="real-estate-listings",
    turns=55,
    holdout=True,
    domain=Domain(
        tables="listings l\nJOIN agents ag ON ag.id = l.agent_id",
        base=(("ts", "l.listed_at"), ("amount", "l.list_price_cad"), ("alias", "list_value"),
              (W, "l.listed_at >= DATE '2024-09-01'")),
        dims=(Dim("neighbourhood", "neighbourhoods", "l.neighbourhood",
                  ("Kitsilano", "Mount Pleasant", "Burnaby", "Richmond")),
              Dim("property type", "property types", "l.property_type",
                  ("condo", "townhouse", "detached")),
              Dim("brokerage", "brokerages", "ag.brokerage",
                  ("Harbour Realty", "Pacific Homes", "Summit Group"))),
        metrics=(Metric("listings", "COUNT(*)", "listings"),
                 Metric("list value", "$money", "$alias"),
                 Metric("median list price",
                        "PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY $amount)", "median_price"),
                 Metric("days on market", "$dom", "dom_days"),
                 Metric("price per floor area", "$ppa", "price_per_area"),
                 Metric("sell-through rate", "ROUND(100.0 * AVG(($sold)::int), 1)",
                        "sell_through_pct")),
        dashboards=("Market Watch", "Developer Brief"),
        table="listings",
        traps=(
            T("How many listings had a price reduction before they sold?",
              "About 38%, most of them detached homes in Richmond.",
              ["SELECT COUNT(*) FILTER (WHERE l.price_cuts > 0) AS reduced\nFROM listings l\n"
               "WHERE l.listed_at >= DATE '2024-09-01'"]),
            T("What's the strata fee on a typical Kitsilano condo?",
              "Around 550 dollars a month for a two-bedroom."),
            T("Do agents get paid when the deal goes firm or on completion?",
              "On completion, once the funds clear."),
            T("How big is the average townhouse in Burnaby?", "Roughly 1,450 square feet."),
        ),
    ),
    says=(
        Say("no-relists", 2, "When a home is pulled and put back on the market it gets a new "
            "listing ID. Dedupe those relists - one home, one listing.",
            "Relists are folded into their original listing (l.relist_of IS NULL).",
            r"dedupe\W+those\W+relists|relists\W+are\W+folded|l\.relist_of\s+IS\s+NULL",
            ((W, "l.relist_of IS NULL"),)),
        Say("dom-firm", 5, "Days on market starts the day a listing goes live on MLS and stops "
            "at the firm sale; unsold ones keep counting to today.",
            "Days on market = firm date (or today) minus the live date.",
            r"stops\W+at\W+the\W+firm\W+sale|firm\W+date\W+\(or\W+today\)|"
            r"COALESCE\(l\.firm_at,\s*CURRENT_DATE\)",
            (("dom", "ROUND(AVG(COALESCE(l.firm_at, CURRENT_DATE) - l.live_at::date), 1)"),),
            uses="dom"),
        Say("ppa-sqft", 8, "Price per area goes per square foot. Our buyers and the board think "
            "in feet, not metres.", "Price per area = list price / floor_area_sqft.",
            r"per\W+square\W+foot|floor_area_sqft", (("ppa", PPA.format("sqft")),), uses="ppa"),
        Say("nearest-1000", 11, "Couple of house rules from the brokerage: prices to the "
            "nearest thousand dollars, nobody quotes a house to the cent,",
            "Amounts now round to the nearest $1,000,",
            r"prices\W+to\W+the\W+nearest\W+thousand|nearest\W+\$1,000|"
            r"ROUND\(SUM\([^()]*\),\s*-3\)",
            (("round", "-3"),), uses="alias"),
        Say("fiscal-nov", 11, "and quarters go by the brokerage's books, whose year opens in "
            "November.", "and quarters follow a November-start year.",
            r"books,?\W+whose\W+year\W+opens\W+in\W+november|november-start\W+year|"
            r"start_month\s*=>\s*11\b",
            (("calendar", "fiscal:11"),), grain="quarter"),
        Say("strata-only", 20, "The developer we're advising only builds strata, so restrict "
            "everything to condos and townhouses until I say otherwise.",
            "Limited to strata units (l.property_type IN ('condo', 'townhouse')).",
            r"restrict\W+everything\W+to\W+condos\W+and\W+townhouses|limited\W+to\W+strata\W+"
            r"units|l\.property_type\s+IN\s+\('condo',\s*'townhouse'\)",
            ((W, "l.property_type IN ('condo', 'townhouse')"),)),
        Say("sold-firm", 24, "Is Burnaby really selling faster, or is that the new towers? And "
            "note for the rest of this: a sale is only a sale once subjects are removed; "
            "conditional offers don't count.",
            "Partly the towers - presales closed in one batch. Sell-through now counts firm "
            "sales only (l.status = 'firm').",
            r"conditional\W+offers\W+don'?t\W+count|counts\W+firm\W+sales\W+only|"
            r"l\.status\s*=\s*'firm'",
            (("sold", "l.status = 'firm'"),), uses="sold"),
        Say("ppa-m2", 28, "The Montreal partners will read this deck too. Switch price per area "
            "to metric.", "Price per area now divides by floor_area_m2.",
            r"switch\W+price\W+per\W+area\W+to\W+metric|floor_area_m2",
            (("ppa", PPA.format("m2")),), replaces="ppa-sqft", uses="ppa"),
        Say("detached-back", 30, "Our client widened the mandate; detached houses are part of "
            "the analysis again.", "Property-type filter removed - every home type counts.",
            r"widened\W+the\W+mandate|detached\W+houses\W+are\W+part|"
            r"property-type\W+filter\W+removed",
            replaces="strata-only"),
    ),
)  # fmt: skip

TELECOM = Scenario(
    name="telecom-churn",
    turns=62,
    holdout=True,
    domain=Domain(
        tables="subscriptions sb\nJOIN customers cu ON cu.id = sb.customer_id",
        base=(("ts", "sb.billed_at"), ("amount", "sb.revenue_zar"), ("alias", "revenue"),
              (W, "sb.billed_at >= DATE '2024-04-01'")),
        dims=(Dim("plan type", "plan types", "sb.plan_type", ("prepaid", "contract", "fibre")),
              Dim("province", "provinces", "cu.province",
                  ("Gauteng", "Western Cape", "KwaZulu-Natal", "Eastern Cape")),
              Dim("sales channel", "sales channels", "cu.channel",
                  ("retail store", "online", "call centre"))),
        metrics=(Metric("revenue", "$money", "$alias"),
                 Metric("active lines", "COUNT(DISTINCT sb.msisdn)", "lines"),
                 Metric("ARPU", "$arpu", "arpu"),
                 Metric("churn rate", "$churn", "churn_pct"),
                 Metric("port-outs", "COUNT(*) FILTER (WHERE sb.ported_out)", "port_outs")),
        dashboards=("Base Health", "Exco Pack"),
        table="subscriptions",
        traps=(
            T("How many customers took their number to a rival in March?",
              "12,400 of them, mostly to the cheaper MVNOs.",
              ["SELECT COUNT(*) AS port_outs\nFROM subscriptions sb\nWHERE sb.ported_out\n"
               "  AND sb.billed_at >= DATE '2025-03-01'"]),
            T("Does a recharge through the banking app count as online?",
              "Yes - it's booked under the online channel."),
            T("What does a contract upgrade usually cost us in handset subsidy?",
              "About R4,000 on a mid-range phone."),
            T("How many IoT SIMs did the smart-meter deal add?",
              "Roughly 85,000, activated in two waves."),
        ),
    ),
    says=(
        Say("no-iot", 2, "IoT lines aren't customers in any sense marketing cares about - smart "
            "meters, trackers, that kind of thing. Drop them.",
            "IoT SIMs removed (sb.line_type <> 'iot').",
            r"IoT\W+lines.{0,120}drop\W+them|IoT\W+SIMs\W+removed|sb\.line_type\s*<>\s*'iot'",
            ((W, "sb.line_type <> 'iot'"),)),
        Say("churn-90", 4, "Churned means no recharge and no bill paid for 90 consecutive days. "
            "That's the regulator's definition and we stick to it.",
            "Churn rate flags lines with 90+ inactive days.",
            r"90\W+consecutive\W+days|90\+\W+inactive\W+days|sb\.days_inactive\s*>=\s*90\b",
            (("churn", CHURN.format(90)),), uses="churn"),
        Say("arpu-msisdn", 7, "Work out ARPU as revenue divided by distinct active numbers in "
            "the period, not by accounts.", "ARPU = revenue / COUNT(DISTINCT msisdn).",
            r"ARPU\W+as\W+revenue\W+divided\W+by\W+distinct|"
            r"/\s*NULLIF\(COUNT\(DISTINCT\s+sb\.msisdn\)",
            (("arpu", "ROUND(SUM($amount) / NULLIF(COUNT(DISTINCT sb.msisdn), 0), 2)"),),
            uses="arpu"),
        Say("ex-vat", 10, "The CFO has two conventions for the annual report: revenue net of the "
            "15% VAT,", "Revenue is now divided by 1.15 to strip VAT,",
            r"net\W+of\W+the\W+15%\W+VAT|divided\W+by\W+1\.15|sb\.revenue_zar\s*/\s*1\.15",
            (("amount", "sb.revenue_zar / 1.15"), ("alias", "revenue_ex_vat")), uses="alias"),
        Say("rand-m2", 10, "and rand figures in millions to two decimals.",
            "and shown in R millions, two decimals.",
            r"rand\W+figures\W+in\W+millions|in\W+R\W+millions|/\s*1e6,\s*2\)",
            (("round", "m2"),)),
        Say("contract-only", 22, "For the retention deep-dive we only care about contract "
            "customers; prepaid behaves like a different animal.",
            "Restricted to contract lines (sb.plan_type = 'contract').",
            r"only\W+care\W+about\W+contract\W+customers|restricted\W+to\W+contract\W+lines|"
            r"sb\.plan_type\s*=\s*'contract'",
            ((W, "sb.plan_type = 'contract'"),)),
        Say("no-employees", 27, "Can you check whether the Western Cape spike is just the Black "
            "Friday promo? Also disregard the lines on our own corporate account from now on, "
            "they're employee phones with free airtime.",
            "Yes, almost all of it is promo gross adds. Employee lines are now excluded "
            "(NOT cu.is_employee).",
            r"disregard\W+the\W+lines\W+on\W+our\W+own\W+corporate|employee\W+lines\W+are\W+now"
            r"\W+excluded|NOT\s+cu\.is_employee",
            ((W, "NOT cu.is_employee"),)),
        Say("churn-60", 33, "Let's line up with the new marketing model: a number is lost once "
            "it's been silent for 60 days.",
            "Churn now triggers at 60 inactive days (sb.days_inactive >= 60).",
            r"silent\W+for\W+60\W+days|60\W+inactive\W+days|sb\.days_inactive\s*>=\s*60\b",
            (("churn", CHURN.format(60)),), replaces="churn-90", uses="churn"),
        Say("whole-base", 37, "Bring prepaid and fibre back in, the exec pack needs the whole "
            "base.", "Plan filter dropped; every plan type counts again.",
            r"bring\W+prepaid\W+and\W+fibre\W+back|the\W+whole\W+base|plan\W+filter\W+dropped",
            replaces="contract-only"),
    ),
)  # fmt: skip

SCENARIOS = (AIRLINE, LISTINGS, TELECOM)
