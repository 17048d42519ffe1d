"""Fidelity scenarios 22-24: SaaS invoicing, retail deposits, clinical trial enrolment.

Written blind to the instruction detector like scenarios_g.py, and tuning data since, like it.
"""

from __future__ import annotations

from memory_core.cli.demo_script import Turn as T
from memory_core.eval.corpus import Dim, Domain, Metric, Say, Scenario

W = "where"
NET = "inv.total_usd - inv.tax_usd"
WRATE = "ROUND(SUM(b.balance_nzd * b.rate_pct) / NULLIF(SUM(b.balance_nzd), 0), 2)"

BILLING = Scenario(
    name="saas-invoicing",
    turns=82,
    holdout=False,
    domain=Domain(
        tables="invoices inv\nJOIN accounts a ON a.id = inv.account_id",
        base=(("ts", "inv.issued_at"), ("amount", "inv.total_usd"), ("alias", "invoiced"),
              (W, "inv.issued_at >= DATE '2024-10-01'")),
        dims=(Dim("plan", "plans", "a.plan", ("Starter", "Team", "Business", "Enterprise")),
              Dim("sales region", "sales regions", "a.region", ("NA", "EMEA", "APAC")),
              Dim("billing cycle", "billing cycles", "inv.cycle", ("monthly", "annual"))),
        metrics=(Metric("invoiced amount", "$money", "$alias"),
                 Metric("invoices", "COUNT(*)", "invoices"),
                 Metric("average invoice", "ROUND(AVG($amount), 2)", "avg_invoice"),
                 Metric("days sales outstanding", "$dso", "dso_days"),
                 Metric("collected share", "ROUND(100.0 * AVG(($paid)::int), 1)",
                        "collected_pct")),
        dashboards=("Billing Health", "CFO Monthly"),
        table="invoices",
        traps=(
            T("How many credit notes did support raise last quarter?",
              "1,140 credit notes, mostly goodwill for the March outage.",
              ["SELECT COUNT(*) AS credit_notes\nFROM invoices inv\n"
               "WHERE inv.kind = 'credit_note'\n  AND inv.issued_at >= DATE '2025-01-01'"]),
            T("Which VAT rate applies to customers in Ireland?",
              "The standard Irish rate, 23%, unless they give us a VAT number."),
            T("Who signs off an Enterprise discount above 30%?",
              "The CRO, after deal desk review."),
            T("Do we send dunning emails before an invoice is due?",
              "One reminder three days before, then at 7, 14 and 21 days overdue."),
        ),
    ),
    says=(
        Say("net-of-tax", 3, "Invoice totals include VAT and sales tax; I want everything net of "
            "tax.", "Amounts are now total minus tax (inv.total_usd - inv.tax_usd).",
            r"net\W+of\W+tax|total\W+minus\W+tax|inv\.total_usd\s*-\s*inv\.tax_usd",
            (("amount", NET),)),
        Say("no-credit-notes", 6, "Credit notes are stored as negative invoices. Skip them, we "
            "analyse those separately.", "Credit notes are skipped (inv.kind <> 'credit_note').",
            r"credit\W+notes.{0,60}skip\W+them|credit\W+notes\W+are\W+skipped|"
            r"inv\.kind\s*<>\s*'credit_note'",
            ((W, "inv.kind <> 'credit_note'"),)),
        Say("paid-30", 9, "Paid means settled within 30 days of the invoice date; anything later "
            "counts as overdue.", "Collected share now uses a 30-day window.",
            r"paid\W+means\W+settled\W+within\W+30\W+days|30-day\W+window|"
            r"inv\.issued_at\s*\+\s*INTERVAL\s+'30 days'",
            (("paid", "inv.paid_at <= inv.issued_at + INTERVAL '30 days'"),), uses="paid"),
        Say("dso", 13, "How long are customers taking to pay us? For that, DSO runs from the "
            "invoice date to the day cash lands, averaged per invoice, in days.",
            "Around 38 days on average, longest in EMEA. DSO is now the mean of paid_at minus "
            "issued_at.",
            r"DSO\W+runs\W+from\W+the\W+invoice\W+date|mean\W+of\W+paid_at\W+minus\W+issued_at|"
            r"AVG\(inv\.paid_at::date\s*-\s*inv\.issued_at::date\)",
            (("dso", "ROUND(AVG(inv.paid_at::date - inv.issued_at::date), 1)"),), uses="dso"),
        Say("no-enterprise", 18, "While you're at it: Enterprise is invoiced by hand, so keep it "
            "out of this,", "Enterprise accounts are excluded (a.plan <> 'Enterprise'),",
            r"enterprise.{0,40}keep\W+it\W+out|enterprise\W+accounts\W+are\W+excluded|"
            r"a\.plan\s*<>\s*'Enterprise'",
            ((W, "a.plan <> 'Enterprise'"),)),
        Say("nearest-thousand", 18, "and dollar figures rounded to the nearest thousand.",
            "and dollars rounded to thousands.",
            r"nearest\W+thousand|rounded\W+to\W+thousands|ROUND\(SUM\([^()]*\),\s*-3\)",
            (("round", "-3"),)),
        Say("fiscal-feb", 31, "Our fiscal year starts on 1 February, so quarters should follow "
            "that from now on.", "Quarters now follow a February fiscal year.",
            r"fiscal\W+year\W+starts\W+on\W+1\W+february|february\W+fiscal\W+year|"
            r"start_month\s*=>\s*2\b",
            (("calendar", "fiscal:2"),), grain="quarter"),
        Say("paid-45", 44, "Collections agreed to a softer line: settlement up to 45 days after "
            "issue still counts as paid.", "Collected share now allows 45 days.",
            r"45\W+days\W+after\W+issue|allows\W+45\W+days|"
            r"inv\.issued_at\s*\+\s*INTERVAL\s+'45 days'",
            (("paid", "inv.paid_at <= inv.issued_at + INTERVAL '45 days'"),),
            replaces="paid-30", uses="paid"),
        Say("enterprise-back", 52, "Stop filtering out the big contracts - those invoices go "
            "through Stripe now too.", "Plan filter dropped; the top tier counts again.",
            r"stop\W+filtering\W+out\W+the\W+big\W+contracts|top\W+tier\W+counts\W+again",
            replaces="no-enterprise"),
    ),
)  # fmt: skip

DEPOSITS = Scenario(
    name="retail-deposits",
    turns=97,
    holdout=False,
    domain=Domain(
        tables="deposit_balances b\nJOIN customers c ON c.id = b.customer_id",
        base=(("ts", "b.snapshot_date"), ("amount", "b.balance_nzd"), ("alias", "balances"),
              (W, "b.snapshot_date >= DATE '2024-07-01'")),
        dims=(Dim("product", "products", "b.product",
                  ("transaction account", "online saver", "term deposit", "notice saver")),
              Dim("segment", "segments", "c.segment", ("personal", "private", "small business")),
              Dim("region", "regions", "c.region",
                  ("Auckland", "Wellington", "Canterbury", "Otago"))),
        metrics=(Metric("balances", "$money", "$alias"),
                 Metric("accounts", "COUNT(DISTINCT b.account_id)", "accounts"),
                 Metric("average balance", "ROUND(AVG($amount), 2)", "avg_balance"),
                 Metric("new customers", "COUNT(DISTINCT c.id) FILTER (WHERE $ntb)", "ntb"),
                 Metric("deposit rate", "$wrate", "rate_pct")),
        dashboards=("Deposit Book", "Funding Committee"),
        table="deposit_balances",
        traps=(
            T("How many staff hold a term deposit with us?",
              "About 2,300 of them, mostly six-month terms.",
              ["SELECT COUNT(DISTINCT c.id) AS staff_holders\nFROM deposit_balances b\n"
               "JOIN customers c ON c.id = b.customer_id\nWHERE c.is_staff\n"
               "  AND b.product = 'term deposit'"]),
            T("What does the Reserve Bank's latest cash rate decision mean for us?",
              "A 25 basis point cut; treasury will reprice savers next week."),
            T("Is there a minimum balance on the online saver?", "No minimum, no fees."),
            T("How are private banking clients onboarded?",
              "Through a relationship manager, with enhanced due diligence."),
        ),
    ),
    says=(
        Say("month-end", 2, "Balances are daily snapshots, so for anything monthly take the "
            "month-end balance only, never a sum of days.",
            "Using month-end snapshots only (b.snapshot_date = b.month_end_date).",
            r"month-end\W+(balance|snapshots)\W+only|b\.snapshot_date\s*=\s*b\.month_end_date",
            ((W, "b.snapshot_date = b.month_end_date"),)),
        Say("nzd-m2", 5, "Balances in millions of NZ dollars, two decimals.",
            "Switched to NZ$m with two decimals.",
            r"millions\W+of\W+NZ\W+dollars|NZ\$m\b|/\s*1e6,\s*2\)", (("round", "m2"),)),
        Say("no-staff", 8, "Staff accounts earn a preferential rate, so they stay out of every "
            "cut.", "Staff are excluded (NOT c.is_staff).",
            r"staff\W+accounts.{0,50}stay\W+out|staff\W+are\W+excluded|NOT\s+c\.is_staff",
            ((W, "NOT c.is_staff"),)),
        Say("ntb-12-months", 12, "We call a customer new-to-bank when their first account was "
            "opened in the last 12 months.",
            "New-to-bank = first account opened within 12 months.",
            r"new-to-bank\W+(when|=).{0,60}12\W+months|"
            r"c\.first_opened_at\s*>=\s*CURRENT_DATE\s*-\s*INTERVAL\s+'12 months'",
            (("ntb", "c.first_opened_at >= CURRENT_DATE - INTERVAL '12 months'"),), uses="ntb"),
        Say("rate-weighted", 17, "Deposit rate has to be balance-weighted, not a simple average "
            "across accounts - a $50 saver shouldn't count like a $5m one.",
            "The deposit rate is now weighted by balance.",
            r"balance-weighted|weighted\W+by\W+balance|SUM\(b\.balance_nzd\s*\*\s*b\.rate_pct\)",
            (("wrate", WRATE),),
            uses="wrate"),
        Say("personal-only", 24, "Two scoping changes for the retail pack: personal customers "
            "only,", "Limited to c.segment = 'personal',",
            r"personal\W+customers\W+only|c\.segment\s*=\s*'personal'",
            ((W, "c.segment = 'personal'"),)),
        Say("no-term-deposits", 24, "and leave term deposits aside, treasury prices those.",
            "and term deposits are set aside (b.product <> 'term deposit').",
            r"leave\W+term\W+deposits\W+aside|term\W+deposits\W+are\W+set\W+aside|"
            r"b\.product\s*<>\s*'term deposit'",
            ((W, "b.product <> 'term deposit'"),)),
        Say("ntb-6-months", 40, "What's driving the Otago outflows? And from now on, someone is "
            "new to the bank only during their first six months, twelve is too generous.",
            "Mostly maturing savers moving to a rival's bonus rate. New customers now means first "
            "account within 6 months.",
            r"first\W+six\W+months|within\W+6\W+months|INTERVAL\s+'6 months'",
            (("ntb", "c.first_opened_at >= CURRENT_DATE - INTERVAL '6 months'"),),
            replaces="ntb-12-months", uses="ntb"),
        Say("all-segments", 55, "Private banking and business customers go back in; the pack "
            "covers the whole deposit book now.",
            "Segment filter removed - every segment is in.",
            r"private\W+banking\W+and\W+business\W+customers\W+go\W+back|whole\W+deposit\W+book|"
            r"segment\W+filter\W+removed",
            replaces="personal-only"),
    ),
)  # fmt: skip

TRIALS = Scenario(
    name="trial-enrolment",
    turns=108,
    holdout=False,
    domain=Domain(
        tables="enrolments e\nJOIN sites s ON s.id = e.site_id",
        base=(("ts", "e.consented_at"), ("amount", "e.site_payment_usd"),
              ("alias", "site_payments"), (W, "e.consented_at >= DATE '2024-06-01'")),
        dims=(Dim("country", "countries", "s.country", ("Poland", "Spain", "Brazil", "Canada")),
              Dim("study arm", "study arms", "e.arm", ("placebo", "low dose", "high dose")),
              Dim("study", "studies", "e.study_code", ("CT-204", "CT-317", "CT-422"))),
        metrics=(Metric("participants", "COUNT(*)", "participants"),
                 Metric("site payments", "$money", "$alias"),
                 Metric("active sites", "COUNT(DISTINCT s.id)", "sites"),
                 Metric("screen failure rate", "$sfr", "screen_fail_pct")),
        dashboards=("Enrolment Tracker", "Sponsor Update"),
        table="sites",
        traps=(
            T("How many rollover patients moved into the extension study?",
              "318 so far, almost all from the high-dose arm.",
              ["SELECT COUNT(*) AS rollovers\nFROM enrolments e\nWHERE e.is_rollover"]),
            T("Why are the Brazilian sites on hold?",
              "ANVISA asked for an amended consent form; the sites are re-consenting."),
            T("What do we pay a site per screened patient?",
              "A flat 450 euros, plus pass-through costs."),
            T("How long is the screening window?", "Up to 28 days before randomisation."),
        ),
    ),
    says=(
        Say("from-randomisation", 3, "A participant counts as enrolled from randomisation, not "
            "from consent.",
            "Enrolment now keys on e.randomised_at (e.randomised_at IS NOT NULL).",
            r"enrolled\W+from\W+randomi[sz]ation|e\.randomised_at\s+IS\s+NOT\s+NULL",
            (("ts", "e.randomised_at"), (W, "e.randomised_at IS NOT NULL"))),
        Say("sfr", 6, "Screen failure rate = screen failures / people screened, as a percentage "
            "with one decimal.", "Screen failure rate uses the site screening log now.",
            r"screen\W+failure\W+rate\W*=\W*screen\W+failures|site\W+screening\W+log|"
            r"SUM\(s\.screen_failures\)\s*/\s*NULLIF\(SUM\(s\.screened\)",
            (("sfr", "ROUND(100.0 * SUM(s.screen_failures) / NULLIF(SUM(s.screened), 0), 1)"),),
            uses="sfr"),
        Say("no-ct101", 10, "CT-101 is an extension study with rollover patients, so it doesn't "
            "belong in enrolment numbers.", "CT-101 is excluded (e.study_code <> 'CT-101').",
            r"CT-101.{0,60}doesn'?t\W+belong|CT-101\W+is\W+excluded|"
            r"e\.study_code\s*<>\s*'CT-101'",
            ((W, "e.study_code <> 'CT-101'"),)),
        Say("eur-thousands", 15, "Site payments go in the sponsor's currency: euros, in "
            "thousands, one decimal.", "Site payments now in EUR k, one decimal.",
            r"euros,?\W+in\W+thousands|in\W+EUR\W+k\b|SUM\(e\.site_payment_eur\)\s*/\s*1000\.0",
            (("amount", "e.site_payment_eur"), ("alias", "site_payments_eur"), ("round", "k1"))),
        Say("weeks-sunday", 19, "Enrolment weeks start on Sunday; that's how the CRO reports "
            "them.", "Weekly buckets now begin on Sunday.",
            r"weeks\W+start\W+on\W+sunday|begin\W+on\W+sunday|"
            r"\+\s*INTERVAL\s+'1 day'\)\s*-\s*INTERVAL\s+'1 day'",
            (("week", "date_trunc('week', $ts + INTERVAL '1 day') - INTERVAL '1 day'"),),
            grain="week"),
        Say("no-brazil", 27, "Please apply this from here: Brazil's sites are on a regulatory "
            "hold, so nothing from Brazil in the numbers.",
            "Excluding Brazil (s.country <> 'Brazil').",
            r"nothing\W+from\W+Brazil|excluding\W+Brazil|s\.country\s*<>\s*'Brazil'",
            ((W, "s.country <> 'Brazil'"),)),
        Say("brazil-back", 48, "The hold on Sao Paulo and Recife was lifted last week; their "
            "patients count again.", "Country filter removed, the Brazilian sites are back.",
            r"hold.{0,40}was\W+lifted|country\W+filter\W+removed", replaces="no-brazil"),
        Say("weeks-monday", 63, "The sponsor wants weeks that open on a Monday, like every other "
            "study report.", "Weekly buckets are Monday-start now.",
            r"open\W+on\W+a\W+monday|monday-start", replaces="weeks-sunday", grain="week"),
        Say("whole-euros", 75, "For the sponsor review show site payments to the euro, not in "
            "thousands.", "Site payments are now rounded to the euro.",
            r"to\W+the\W+euro\b|ROUND\(SUM\(e\.site_payment_eur\)\)",
            (("amount", "e.site_payment_eur"), ("alias", "site_payments_eur"), ("round", "0")),
            replaces="eur-thousands"),
    ),
)  # fmt: skip

SCENARIOS = (BILLING, DEPOSITS, TRIALS)
