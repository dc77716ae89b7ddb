"""Write docs/models.md's model-zoo table from config/models/ (the model_zoo rule's results/model_zoo.md, same code).

python docs/model_zoo.py          # rewrite the table between the model-zoo markers in docs/models.md
python docs/model_zoo.py --check  # exit 1 if it is out of date (a test runs this)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from generated import write_or_check

from moeplace.model.model_zoo import markdown, zoo_table

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs/models.md"
BLOCK = re.compile(r"(<!-- model-zoo:start.*?-->\n)(.*?)(<!-- model-zoo:end -->)", re.DOTALL)


def main() -> int:
    table = markdown(zoo_table(sorted((ROOT / "config/models").glob("*.yaml"))))
    updated = BLOCK.sub(lambda m: m[1] + table + m[3], PAGE.read_text())
    return write_or_check(PAGE, updated, "docs/models.md's model-zoo table", "model_zoo.py")


if __name__ == "__main__":
    sys.exit(main())
