"""Reads JSON lines {"schema": {...}, "doc": "text"} on stdin; prints one line per input:
"valid", or "invalid: <reason>" (the text must parse as JSON and validate against the schema
under Draft 2020-12, by the `jsonschema` package)."""
import json
import sys

import jsonschema

for line in sys.stdin:
    case = json.loads(line)
    try:
        doc = json.loads(case["doc"])
    except ValueError as e:
        print(f"invalid: not JSON: {e}")
        continue
    errors = list(jsonschema.Draft202012Validator(case["schema"]).iter_errors(doc))
    print("valid" if not errors else "invalid: " + errors[0].message.replace("\n", " "))
