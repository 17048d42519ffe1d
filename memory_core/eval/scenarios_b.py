"""Fidelity scenarios 4-6: a subscription box, a B2B sales pipeline, a mobile game."""

from __future__ import annotations

from memory_core.cli.demo_script import Turn as T
from memory_core.eval.corpus import Dim, Domain, Metric, Say, Scenario

W = "where"

SUBSCRIPTION_BOX = Scenario(
    name="subscription-box",
    turns=61,
    domain=Domain(
        tables="orders o\nJOIN customers c ON c.id = o.customer_id",
        base=(("ts", "o.ordered_at"), ("amount", "o.amount_usd"), ("alias", "revenue"),
              (W, "o.ordered_at >= DATE '2025-01-01'")),
        dims=(Dim("box type", "box types", "o.box_type", ("Classic", "Veggie", "Family")),
              Dim("acquisition source", "acquisition sources", "c.source",
                  ("referral", "paid social", "podcast")),
              Dim("country", "countries", "c.country", ("GB", "IE", "US"))),
        metrics=(Metric("revenue", "$money", "$alias"),
                 Metric("boxes shipped", "COUNT(*)", "boxes"),
                 Metric("average box value", "ROUND(AVG($amount), 2)", "avg_box_value"),
                 Metric("active customers", "COUNT(DISTINCT c.id) FILTER (WHERE $active)",
                        "active_customers"),
                 Metric("churned customers", "COUNT(DISTINCT c.id) FILTER (WHERE $churned)",
                        "churned_customers")),
        dashboards=("Box Metrics", "Retention Review"),
        table="customers",
        traps=(
            T("Do gift subscriptions renew more often than regular ones?",
              "Gift subscriptions renew 22% of the time, regular ones 61%."),
            T("What's 100 pounds worth at today's rate?", "About $127."),
            T("How many customers do we have in Ireland?", "3,420 customers are based in Ireland.",
              ["SELECT COUNT(*) AS customers\nFROM customers\nWHERE country = 'IE'"]),
            T("Which customers were active on the website last week?",
              "7,905 customers logged in last week; 2,110 of them browsed the menu."),
        ),
    ),
    says=(
        Say("active-90-days", 3, "An active customer is one with an order in the last 90 days.",
            "Noted - 41,200 active customers by that definition today.",
            r"active\W+customers?.{0,80}90\W+days|"
            r"c\.last_order_at\s*>=\s*CURRENT_DATE\s*-\s*INTERVAL\s+'90 days'",
            (("active", "c.last_order_at >= CURRENT_DATE - INTERVAL '90 days'"),),
            uses="active"),
        Say("pounds-sterling", 6, "Report everything in pounds sterling, we're a UK business.",
            "All amounts now in GBP (amount_gbp).",
            r"pounds\W+sterling|\bin\W+GBP\b|amount_gbp", (("amount", "o.amount_gbp"),)),
        Say("no-gift-subscriptions", 9, "Gift subscriptions skew retention, so exclude them.",
            "Gift subscriptions are excluded from here on (NOT o.is_gift).",
            r"exclud\w*\W+(the\W+|all\W+)?gift|gift\W+subscriptions?.{0,40}exclud\w*|"
            r"NOT\s+o\.is_gift",
            ((W, "NOT o.is_gift"),)),
        Say("london-time", 15, "All timestamps in London time please.",
            "Converted: dates are now Europe/London.",
            r"london\W+time|Europe/London", (("tz", "Europe/London"),)),
        Say("uk-and-ireland", 20, "Only UK and Ireland customers from here on.",
            "Scoped to GB and IE.",
            r"only\W+(the\W+)?UK\W+and\W+Ireland|c\.country\s+IN\s+\('GB',\s*'IE'\)",
            ((W, "c.country IN ('GB', 'IE')"),)),
        Say("churn-two-months", 25,
            "When I say churn I mean two months in a row without an order.",
            "Got it: churned = no order for two consecutive months.",
            r"churn.{0,60}(two|2)\W+(consecutive\W+)?months|two\W+months\W+in\W+a\W+row|"
            r"c\.months_without_order\s*>=\s*2",
            (("churned", "c.months_without_order >= 2"),), uses="churned"),
        Say("active-60-days", 30, "Let's tighten that activity rule: ordered within the last "
            "60 days.",
            "Updated - active now requires an order in the last 60 days; 33,900 customers "
            "qualify.",
            r"active.{0,60}60\W+days|activity\W+rule.{0,60}60\W+days|INTERVAL\s+'60 days'",
            (("active", "c.last_order_at >= CURRENT_DATE - INTERVAL '60 days'"),),
            replaces="active-90-days", uses="active"),
        Say("us-dollars", 35, "Forget sterling - the new CFO wants everything in US dollars.",
            "Switched back to USD (amount_usd).",
            r"US\W+dollars|\bUSD\b|amount_usd", (("amount", "o.amount_usd"),),
            replaces="pounds-sterling"),
    ),
)  # fmt: skip

B2B_PIPELINE = Scenario(
    name="b2b-pipeline",
    turns=67,
    domain=Domain(
        tables="opportunities op\nJOIN accounts a ON a.id = op.account_id",
        base=(("ts", "op.created_at"), ("amount", "op.amount_usd"), ("alias", "pipeline"),
              (W, "op.created_at >= DATE '2025-01-01'")),
        dims=(Dim("stage", "stages", "op.stage", ("Discovery", "Proposal", "Negotiation")),
              Dim("team", "teams", "op.team", ("Inside Sales", "Field", "Channel")),
              Dim("industry", "industries", "a.industry",
                  ("Retail", "Manufacturing", "Finance", "Healthcare")),
              Dim("region", "regions", "a.region", ("EMEA", "NA", "APAC"))),
        metrics=(Metric("pipeline", "$money", "$alias"),
                 Metric("deal count", "COUNT(*)", "deals"),
                 Metric("average deal size", "ROUND(AVG($amount))", "avg_deal"),
                 Metric("win rate", "ROUND(100.0 * AVG(($won)::int), 1)", "win_rate_pct")),
        dashboards=("Pipeline Review", "QBR Deck"),
        table="opportunities",
        traps=(
            T("Which partners sourced the most deals last year?",
              "Contoso Partners sourced 41 deals, Fabrikam 29.",
              ["SELECT partner_name, COUNT(*) AS deals\nFROM opportunities\n"
               "WHERE source = 'partner' AND created_at >= DATE '2024-01-01'\nGROUP BY 1\n"
               "ORDER BY 2 DESC"]),
            T("Is February the slowest month for new deals?",
              "Yes, February has the fewest new opportunities, 18% below average."),
            T("How many deals are verbally agreed but not signed?",
              "23 deals are verbally agreed without a signed contract yet."),
            T("What does the Channel team actually sell?",
              "Mostly renewals and add-ons through resellers."),
        ),
    ),
    says=(
        Say("won-deal", 2,
            "By a won deal we mean stage 'Closed Won' with a signed contract - verbal yeses "
            "don't count.",
            "Noted: won = Closed Won AND contract_signed.",
            r"won\W+deals?.{0,80}(signed\W+contract|closed\W+won)|op\.contract_signed",
            (("won", "op.stage = 'Closed Won' AND op.contract_signed"),), uses="won"),
        Say("no-partner-deals", 5, "Ignore partner-sourced deals, another team books those.",
            "Partner-sourced opportunities are excluded (op.source <> 'partner').",
            r"ignor\w*\W+(all\W+)?partner(-|\W+)sourced|partner(-|\W+)sourced\W+"
            r"(deals|opportunities)\W+are\W+excluded|op\.source\s*<>\s*'partner'",
            ((W, "op.source <> 'partner'"),)),
        Say("fiscal-february", 9, "Our fiscal year starts in February, so use fiscal quarters.",
            "Quarters now follow the February fiscal year (start_month => 2).",
            r"fiscal\W+year\W+(starts?|begins?)\W+in\W+february|february\W+fiscal|"
            r"start_month\s*=>\s*2\b",
            (("calendar", "fiscal:2"),), grain="quarter"),
        Say("millions", 14, "Express pipeline in millions, two decimals is plenty.",
            "Pipeline is now shown in $M with two decimals.",
            r"in\W+millions|\$M\W+with\W+two\W+decimals|/\s*1e6,\s*2\)", (("round", "m2"),)),
        Say("emea-only", 20, "Let's restrict this to EMEA accounts from now on.",
            "Restricted to a.region = 'EMEA'.",
            r"restrict\w*.{0,30}EMEA|EMEA\W+(accounts\W+)?only|only\W+EMEA|"
            r"a\.region\s*=\s*'EMEA'",
            ((W, "a.region = 'EMEA'"),)),
        Say("acv", 26,
            "Use ACV rather than total contract value: divide each contract by its term in "
            "years.",
            "Switched the amount to ACV = amount / term_years.",
            r"\bACV\b.{0,40}(rather\W+than|not)\W+total|ACV\W*=\W*amount|"
            r"op\.amount_usd\s*/\s*op\.term_years",
            (("amount", "op.amount_usd / op.term_years"), ("alias", "acv"))),
        Say("global", 36, "OK, the regional review is done - back to global numbers.",
            "Region filter removed: all regions again.",
            r"back\W+to\W+global|global\W+numbers|all\W+regions\W+again", replaces="emea-only"),
        Say("partner-deals-back", 41,
            "Actually, put partner deals back in - leadership wants the full pipeline.",
            "Partner-sourced deals are included again.",
            r"partner\W+deals\W+back|partner(-|\W+)sourced\W+deals\W+are\W+included|"
            r"includ\w*\W+partner",
            replaces="no-partner-deals"),
    ),
)  # fmt: skip

MOBILE_GAME = Scenario(
    name="mobile-game",
    turns=73,
    domain=Domain(
        tables="events e\nJOIN players p ON p.id = e.player_id",
        base=(("ts", "e.event_at"), ("amount", "e.gross_usd"), ("alias", "revenue"),
              (W, "e.event_at >= DATE '2025-06-01'")),
        dims=(Dim("platform", "platforms", "p.platform", ("ios", "android", "pc")),
              Dim("country", "countries", "p.country", ("JP", "US", "KR", "BR")),
              Dim("game mode", "game modes", "e.mode", ("ranked", "casual", "co-op"))),
        metrics=(Metric("revenue", "$money", "$alias"),
                 Metric("matches played", "COUNT(*) FILTER (WHERE e.event = 'match_end')",
                        "matches"),
                 Metric("DAU", "COUNT(DISTINCT e.player_id) FILTER (WHERE $dau)", "dau"),
                 Metric("whales", "COUNT(DISTINCT p.id) FILTER (WHERE $whale)", "whales")),
        dashboards=("Live Ops", "Monetisation"),
        table="players",
        traps=(
            T("How many bot accounts did anti-cheat ban this week?",
              "Anti-cheat banned 9,412 bot accounts this week.",
              ["SELECT COUNT(*) AS banned\nFROM players\n"
               "WHERE is_bot AND banned_at >= CURRENT_DATE - 7"]),
            T("What time is the daily reset in Tokyo?", "The daily reset is 04:00 in Tokyo."),
            T("Do PC players spend more than console players?",
              "PC players spend 1.8x more per head."),
            T("What did the top spender buy last month?",
              "Mostly battle-pass tiers and two legendary skins."),
        ),
    ),
    says=(
        Say("no-bots", 2, "Please filter out bots, anti-cheat flags them as p.is_bot.",
            "Bots are filtered out from now on (NOT p.is_bot).",
            r"filter\w*\W+out\W+(the\W+)?bots|bots\W+are\W+(filtered|excluded)|NOT\s+p\.is_bot",
            ((W, "NOT p.is_bot"),)),
        Say("dau-definition", 4,
            "DAU for us = a player who finished at least one match that day; logins alone "
            "don't count.",
            "Understood: DAU counts players with a match_end event that day.",
            r"DAU.{0,60}(finish\w*|complet\w*)\W+(at\W+least\W+)?(one|a|1)\W+match|"
            r"DAU\W+counts\W+players\W+with\W+a\W+match_end",
            (("dau", "e.event = 'match_end'"),), uses="dau"),
        Say("utc", 7, "Keep every timestamp in UTC, our players are worldwide.",
            "Timestamps are pinned to UTC.",
            r"\bin\W+UTC\b|pinned\W+to\W+UTC|AT\s+TIME\s+ZONE\s+'UTC'", (("tz", "UTC"),)),
        Say("net-of-store-fees", 12,
            "Revenue means net of app-store fees, so take 30% off gross.",
            "Revenue is now gross_usd x 0.7.",
            r"net\W+of\W+(the\W+)?(app(-|\W)store\W+)?fees|gross_usd\W+x\W+0\.7|"
            r"e\.gross_usd\s*\*\s*0\.7",
            (("amount", "e.gross_usd * 0.7"),)),
        Say("mobile-only", 18, "Only mobile platforms please, no PC or console.",
            "Scoped to iOS and Android.",
            r"only\W+mobile\W+platforms|no\W+PC\W+or\W+console|"
            r"p\.platform\s+IN\s+\('ios',\s*'android'\)",
            ((W, "p.platform IN ('ios', 'android')"),)),
        Say("whale", 23, "A whale is anyone who spent over $500 in their first 30 days.",
            "Noted - 2,140 whales so far.",
            r"whales?.{0,60}(over|more\W+than|above)\W+\$?500|p\.spend_first_30d_usd\s*>\s*500",
            (("whale", "p.spend_first_30d_usd > 500"),), uses="whale"),
        Say("japan-time", 31,
            "Change of plan: use Japan time for dates, the publisher sits in Tokyo.",
            "Dates are now in Asia/Tokyo.",
            r"japan\W+time|Asia/Tokyo", (("tz", "Asia/Tokyo"),), replaces="utc"),
        Say("bots-back", 40, "Actually, include the bots again - we're sizing server load.",
            "Bots are back in the counts.",
            r"includ\w*\W+(the\W+)?bots|bots\W+are\W+back", replaces="no-bots"),
        Say("no-short-sessions", 46, "Sessions shorter than 60 seconds are noise; drop them.",
            "Short sessions are excluded (e.session_seconds >= 60).",
            r"sessions?\W+(shorter|under|below)\W+(than\W+)?(60|sixty)\W+seconds|"
            r"e\.session_seconds\s*>=\s*60",
            ((W, "e.session_seconds >= 60"),)),
    ),
)  # fmt: skip

SCENARIOS = (SUBSCRIPTION_BOX, B2B_PIPELINE, MOBILE_GAME)
