"""Fidelity scenarios 19-21: hotel revenue, manufacturing quality, transit ridership.

Written as a held-out set (scenarios_g.py and scenarios_h.py), without looking at the
instruction detector, after scenarios_a..f became tuning data; the detector is now tuned on
them too, so they are tuning data (`holdout=False`) and the held-out set is scenarios_i.py and
scenarios_j.py. Every instruction is worded the way an analyst might type it:
declaratives, imperatives with a reason, definitions as "X = A / B", "X runs from A to B" or
"we call it Y when ...", units and rounding, two instructions in one message, one hidden in a
longer question, restrictions lifted, and replacements that name their subject differently.
"""

from __future__ import annotations

from memory_core.cli.demo_script import Turn as T
from memory_core.eval.corpus import Dim, Domain, Metric, Say, Scenario

W = "where"
DPMO = "ROUND(1e6 * SUM(i.defects) / NULLIF(SUM(i.units * l.opportunities), 0))"
FRIDAY_WEEK = "date_trunc('week', $ts - INTERVAL '4 days') + INTERVAL '4 days'"

HOTEL = Scenario(
    name="hotel-revenue",
    turns=50,
    holdout=False,
    domain=Domain(
        tables="stays s\nJOIN properties p ON p.id = s.property_id",
        base=(("ts", "s.stay_date"), ("amount", "s.room_revenue_usd"), ("alias", "room_revenue"),
              (W, "s.stay_date >= DATE '2025-01-01'")),
        dims=(Dim("property", "properties", "p.name", ("Alfama", "Baixa", "Belem", "Airport")),
              Dim("booking channel", "booking channels", "s.channel",
                  ("direct", "Booking.com", "Expedia", "GDS")),
              Dim("room type", "room types", "s.room_type", ("standard", "deluxe", "suite"))),
        metrics=(Metric("room revenue", "$money", "$alias"),
                 Metric("room nights", "COUNT(*)", "room_nights"),
                 Metric("average daily rate", "ROUND(AVG($amount), 2)", "adr"),
                 Metric("RevPAR", "$revpar", "revpar")),
        dashboards=("Revenue Pulse", "Owner Report"),
        table="stays",
        traps=(
            T("How many comp rooms did the general managers sign off in June?",
              "31 comp nights in June, mostly loyalty upgrades at Baixa.",
              ["SELECT p.name, COUNT(*) AS comp_nights\nFROM stays s\n"
               "JOIN properties p ON p.id = s.property_id\nWHERE s.rate_code = 'COMP'\n"
               "  AND s.stay_date >= DATE '2025-06-01'\nGROUP BY 1"]),
            T("When does the room block for the September pharma conference release?",
              "Unsold rooms in that block go back to general sale 21 days before arrival."),
            T("Do guests pay at the desk in euros?",
              "Yes, folios settle in euros; the owner statements are converted later."),
            T("Which weekday has the most walk-ins?", "Saturdays, by a wide margin."),
        ),
    ),
    says=(
        Say("no-comp-rooms", 2, "Comp rooms are zero-rate stays, so keep them out of everything; "
            "they only drag the averages down.",
            "Got it - complimentary stays are excluded (s.rate_code <> 'COMP').",
            r"comp(limentary)?\W+(rooms|stays).{0,40}(keep\W+them\W+out|out\W+of\W+everything|"
            r"are\W+excluded)|s\.rate_code\s*<>\s*'COMP'",
            ((W, "s.rate_code <> 'COMP'"),)),
        Say("week-friday", 4, "Our hotel week runs Friday to Thursday, because that's when the "
            "weekend pricing resets, so weekly numbers should follow that.",
            "Weeks now start on Friday.",
            r"week\W+runs\W+friday\W+to\W+thursday|weeks\W+now\W+start\W+on\W+friday|"
            r"INTERVAL\s+'4 days'\)\s*\+\s*INTERVAL\s+'4 days'",
            (("week", FRIDAY_WEEK),), grain="week"),
        Say("revpar-available", 7, "RevPAR = room revenue / available room nights, not occupied "
            "ones.", "RevPAR now divides revenue by rooms available.",
            r"revpar\W*=\W*room\W+revenue\W*/\W*available|divides\W+revenue\W+by\W+rooms\W+"
            r"available|/\s*NULLIF\(SUM\(s\.rooms_available\),\s*0\)",
            (("revpar", "ROUND(SUM($amount) / NULLIF(SUM(s.rooms_available), 0), 2)"),),
            uses="revpar"),
        Say("in-gbp", 12, "The owners sit in London: put all money in GBP,",
            "Revenue now comes from room_revenue_gbp,",
            r"money\W+in\W+GBP|room_revenue_gbp", (("amount", "s.room_revenue_gbp"),)),
        Say("no-decimals", 12, "and no decimals anywhere, pence are noise at this level.",
            "rounded to whole pounds.",
            r"no\W+decimals|whole\W+pounds|ROUND\(SUM\([^()]*\)\)", (("round", "0"),)),
        Say("no-group-blocks", 17, "Is the Baixa occupancy dip real or just timing? Also, leave "
            "group blocks out from now on - they're contracted months ahead and hide transient "
            "demand.",
            "It's real: two tour operators cut their allotments. Group blocks are now excluded "
            "(NOT s.is_group_block).",
            r"leave\W+group\W+blocks\W+out|group\W+blocks\W+are\W+now\W+excluded|"
            r"NOT\s+s\.is_group_block",
            ((W, "NOT s.is_group_block"),)),
        Say("week-iso", 21, "Finance wants weekly figures on ISO weeks now, Monday through "
            "Sunday, so they line up with the P&L.",
            "Switched weekly buckets to ISO weeks.",
            r"ISO\W+weeks|monday\W+through\W+sunday", replaces="week-friday", grain="week"),
        Say("groups-back", 25, "Put group business back in, sales wants to see how the "
            "allotments pick up.",
            "Done, group bookings count again alongside transient stays.",
            r"group\W+business\W+back\W+in|group\W+bookings\W+count\W+again",
            replaces="no-group-blocks"),
        Say("lisbon-time", 29, "One more convention: stay dates are stored in UTC but the night "
            "audit runs on Lisbon time, so use that.",
            "Dates are converted to Europe/Lisbon before bucketing.",
            r"lisbon\W+time|Europe/Lisbon", (("tz", "Europe/Lisbon"),)),
    ),
)  # fmt: skip

FACTORY = Scenario(
    name="manufacturing-quality",
    turns=58,
    holdout=False,
    domain=Domain(
        tables="inspections i\nJOIN lots l ON l.id = i.lot_id",
        base=(("ts", "i.inspected_at"), ("amount", "i.scrap_cost_eur"), ("alias", "scrap_cost"),
              (W, "i.inspected_at >= DATE '2025-01-01'")),
        dims=(Dim("plant", "plants", "l.plant", ("Brno", "Ostrava", "Plzen")),
              Dim("product line", "product lines", "l.product_line",
                  ("brackets", "housings", "shafts", "gears")),
              Dim("shift", "shifts", "i.shift", ("early", "late", "night"))),
        metrics=(Metric("scrap cost", "$money", "$alias"),
                 Metric("units inspected", "SUM(i.units)", "units"),
                 Metric("inspections", "COUNT(*)", "inspections"),
                 Metric("defect rate", "$dpmo", "dpmo"),
                 Metric("first pass yield", "$fpy", "fpy_pct")),
        dashboards=("Quality Board", "Plant Review"),
        table="inspections",
        traps=(
            T("How many lots went through rework in March?",
              "212 lots, most of them housings from the new die.",
              ["SELECT l.product_line, COUNT(DISTINCT i.lot_id) AS reworked_lots\n"
               "FROM inspections i\nJOIN lots l ON l.id = i.lot_id\nWHERE i.is_rework\n"
               "  AND i.inspected_at >= DATE '2025-03-01'\nGROUP BY 1"]),
            T("Who calibrates the gauges on the night shift?",
              "The metrology team, every second Tuesday."),
            T("What does a scrapped shaft cost us in material?",
              "About 14 euros of steel before machining."),
            T("Is Plzen's new press line running yet?",
              "It's in trial runs; series production starts next quarter."),
        ),
    ),
    says=(
        Say("no-rework", 2, "Reworked units show up twice in this table, so drop the rework "
            "lines before you aggregate anything.",
            "OK - rework lines are dropped from every query (NOT i.is_rework).",
            r"drop\W+the\W+rework\W+lines|rework\W+lines\W+are\W+dropped|NOT\s+i\.is_rework",
            ((W, "NOT i.is_rework"),)),
        Say("dpmo", 5, "We express the defect rate per million opportunities: defects divided by "
            "units times opportunities per unit, times 1,000,000.",
            "Defect rate is now defects per million opportunities.",
            r"per\W+million\W+opportunities|"
            r"1e6\s*\*\s*SUM\(i\.defects\)\s*/\s*NULLIF\(SUM\(i\.units\s*\*\s*l\.opportunities\)",
            (("dpmo", DPMO),),
            uses="dpmo"),
        Say("fpy", 9, "First pass yield is the share of inspections that pass on the first "
            "attempt, as a percent.",
            "FPY = passes on attempt 1 over all first attempts, in %.",
            r"first\W+pass\W+yield\W+is\W+the\W+share|FPY\W*=\W*passes|"
            r"i\.attempt\s*=\s*1\s+AND\s+i\.result\s*=\s*'pass'",
            (("fpy", "ROUND(100.0 * AVG((i.attempt = 1 AND i.result = 'pass')::int), 1)"),),
            uses="fpy"),
        Say("brno-ostrava", 14, "Plzen is still commissioning its presses; until that's done we "
            "only look at Brno and Ostrava.",
            "Scoped to two plants (l.plant IN ('Brno', 'Ostrava')).",
            r"only\W+look\W+at\W+Brno\W+and\W+Ostrava|l\.plant\s+IN\s+\('Brno',\s*'Ostrava'\)",
            ((W, "l.plant IN ('Brno', 'Ostrava')"),)),
        Say("eur-k1", 18, "Going forward, costs in thousands of euros with one decimal,",
            "Scrap cost now shows as EUR k, one decimal,",
            r"thousands\W+of\W+euros.{0,30}one\W+decimal|EUR\W+k,?\W+one\W+decimal|"
            r"/\s*1000\.0,\s*1\)",
            (("round", "k1"),)),
        Say("no-night", 18, "and the night shift is out until their gauges are recalibrated.",
            "and night-shift inspections are excluded (i.shift <> 'night').",
            r"night\W+shift\W+is\W+out|night-shift\W+inspections\W+are\W+excluded|"
            r"i\.shift\s*<>\s*'night'",
            ((W, "i.shift <> 'night'"),)),
        Say("qa-confirmed", 24, "Why did housings spike in week 30? And from here on, a defect "
            "only counts when QA confirmed it; operator-flagged suspects aren't defects.",
            "A bad coil batch hit housings in week 30. Defects now need QA confirmation "
            "(i.qa_confirmed).",
            r"only\W+counts\W+when\W+QA\W+confirmed|defects\W+now\W+need\W+QA|"
            r"i\.qa_confirmed\b",
            ((W, "i.qa_confirmed"),)),
        Say("all-plants", 28, "Plzen signed off its press line, so bring it back and compare "
            "all three plants.",
            "Plant filter removed - all three sites are in.",
            r"compare\W+all\W+three\W+plants|plant\W+filter\W+removed", replaces="brno-ostrava"),
        Say("nights-back", 32, "Metrology finished the recalibration: the 22:00-06:00 crew "
            "counts again.", "Night-shift inspections are included again.",
            r"22:00-06:00\W+crew\W+counts\W+again|night-shift\W+inspections\W+are\W+included",
            replaces="no-night"),
    ),
)  # fmt: skip

TRANSIT = Scenario(
    name="transit-ridership",
    turns=70,
    holdout=False,
    domain=Domain(
        tables="taps t\nJOIN routes r ON r.id = t.route_id",
        base=(("ts", "t.tapped_at"), ("amount", "t.fare_paid_aud"), ("alias", "fare_revenue"),
              (W, "t.tapped_at >= DATE '2025-01-01'")),
        dims=(Dim("mode", "modes", "r.mode", ("bus", "tram", "ferry", "light rail")),
              Dim("depot", "depots", "r.depot", ("Northgate", "Southbank", "Westfield")),
              Dim("fare type", "fare types", "t.fare_type", ("adult", "concession", "senior"))),
        metrics=(Metric("boardings", "COUNT(*)", "boardings"),
                 Metric("fare revenue", "$money", "$alias"),
                 Metric("unique riders", "COUNT(DISTINCT t.card_id)", "riders"),
                 Metric("fare evasion", "$evasion", "evasion_rate"),
                 Metric("peak share", "ROUND(100.0 * AVG(($peak)::int), 1)", "peak_share_pct")),
        dashboards=("Ridership Weekly", "Network Performance"),
        table="routes",
        traps=(
            T("How many transfers does a typical commuter make?",
              "1.4 on average; most of them bus to light rail at Roma Street.",
              ["SELECT AVG(transfers) AS avg_transfers\nFROM (\n"
               "  SELECT t.card_id, t.journey_id, COUNT(*) - 1 AS transfers\n"
               "  FROM taps t\n  GROUP BY 1, 2\n) j"]),
            T("Does the weekend timetable run every 15 minutes?",
              "On the core bus routes, yes; trams run every 10."),
            T("Who operates the ferries?", "A private contractor under a ten-year agreement."),
            T("How are fare inspectors rostered?",
              "In teams of four, concentrated on the trams in the morning."),
        ),
    ),
    says=(
        Say("first-tap", 2, "A transfer tap isn't a new trip - only count the first tap of each "
            "journey.", "Transfers are filtered out (NOT t.is_transfer).",
            r"transfer\W+tap\W+isn'?t\W+a\W+new\W+trip|first\W+tap\W+of\W+each\W+journey|"
            r"NOT\s+t\.is_transfer",
            ((W, "NOT t.is_transfer"),)),
        Say("weekdays-only", 4, "Weekend service runs a different timetable, so weekdays only "
            "for now.", "Saturday and Sunday taps are left out.",
            r"weekdays\W+only|saturday\W+and\W+sunday\W+taps\W+are\W+left\W+out|"
            r"EXTRACT\(ISODOW\s+FROM\s+t\.tapped_at\)\s*<\s*6",
            ((W, "EXTRACT(ISODOW FROM t.tapped_at) < 6"),)),
        Say("evasion-per-1000", 7, "Please report fare evasion per 1,000 boardings rather than "
            "as a percentage, the board finds percentages too small to read.",
            "Fare evasion is now a rate per thousand boardings.",
            r"per\W+(1,?000|thousand)\W+boardings|1000\.0\s*\*\s*SUM\(t\.is_evasion::int\)",
            (("evasion", "ROUND(1000.0 * SUM(t.is_evasion::int) / NULLIF(COUNT(*), 0), 1)"),),
            uses="evasion"),
        Say("brisbane-time", 11, "Taps are logged in UTC; put everything on Brisbane time before "
            "bucketing.", "Converted to Australia/Brisbane.",
            r"brisbane\W+time|Australia/Brisbane", (("tz", "Australia/Brisbane"),)),
        Say("peak-7-9-4-6", 16, "We call it a peak boarding when the tap is between 7 and 9 in "
            "the morning or 4 and 6 in the evening.",
            "Peak = taps in hours 7-8 and 16-17 (IN (7, 8, 16, 17)).",
            r"peak\W+boarding\W+when.{0,40}7\W+and\W+9|IN\s+\(7,\s*8,\s*16,\s*17\)",
            (("peak", "EXTRACT(HOUR FROM t.tapped_at) IN (7, 8, 16, 17)"),), uses="peak"),
        Say("no-ferries", 22, "Two housekeeping rules. Ferries are run by a contractor with its "
            "own counts, so leave them out,", "Ferries excluded (r.mode <> 'ferry'),",
            r"ferr(y|ies).{0,70}leave\W+them\W+out|ferries\W+excluded|r\.mode\s*<>\s*'ferry'",
            ((W, "r.mode <> 'ferry'"),)),
        Say("nearest-dollar", 22, "and money to the nearest dollar.",
            "and fares rounded to whole dollars.",
            r"nearest\W+dollar|whole\W+dollars|ROUND\(SUM\([^()]*\)\)", (("round", "0"),)),
        Say("weekends-back", 30, "Weekend data can come back - the Saturday timetable is "
            "comparable now.", "Saturdays and Sundays are included again.",
            r"weekend\W+data\W+can\W+come\W+back|saturdays\W+and\W+sundays\W+are\W+included",
            replaces="weekdays-only"),
        Say("rush-6-10-3-7", 38, "The board redefined the rush: 6 to 10 in the morning and 3 to "
            "7 in the afternoon.",
            "Updated the rush-hour window to hours 6-9 and 15-18.",
            r"rush.{0,40}6\W+to\W+10.{0,40}3\W+to\W+7|rush-hour\W+window\W+to\W+hours\W+6-9|"
            r"IN\s+\(6,\s*7,\s*8,\s*9,\s*15",
            (("peak", "EXTRACT(HOUR FROM t.tapped_at) IN (6, 7, 8, 9, 15, 16, 17, 18)"),),
            replaces="peak-7-9-4-6", uses="peak"),
    ),
)  # fmt: skip

SCENARIOS = (HOTEL, FACTORY, TRANSIT)
