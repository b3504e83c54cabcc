"""Reports for people: tables, preflight, audit (table/JSON/Markdown/HTML), all-reduce."""
