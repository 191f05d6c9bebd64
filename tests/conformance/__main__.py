"""``python -m tests.conformance`` (from the repository root): every conformance case's result and the counts,
ExportDB's not-yet-supported cases too (a measurement, outside the suite)."""
import sys

from .examples import CASES
from .runner import exportdb_cases, run


def main() -> int:
    for title, cases in [("ExportDB (supported)", exportdb_cases()),
                         ("ExportDB (not supported yet)", exportdb_cases(supported=False)), ("our examples", CASES)]:
        print(f"== {title}")
        results = run(cases)
        print(f"-- {sum(r == 'ok' for r in results.values())}/{len(results)} pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
