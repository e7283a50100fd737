"""The E2B code-interpreter quickstart, unchanged, running on Glovebox.

    pip install e2b-code-interpreter==2.11.5
    export E2B_API_URL=http://127.0.0.1:7171 E2B_SANDBOX_URL=http://127.0.0.1:7171
    export E2B_API_KEY=$(cat /var/lib/glovebox/api-key)
    python3 examples/e2b_quickstart.py

Needs the code-interpreter template (scripts/build-code-interpreter). Prints the statistics
of 100 random numbers, saves their histogram to histogram.png, and reads a CSV with pandas.
"""

import base64
import os
import sys

from e2b_code_interpreter import Sandbox

if not os.environ.get("E2B_API_URL"):
    sys.exit("set E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (see the top of this file)")

sbx = Sandbox.create()
try:
    execution = sbx.run_code(
        """
import numpy as np
import matplotlib.pyplot as plt

data = np.random.randint(0, 100, size=100)
print(f"Mean: {np.mean(data):.2f}")
print(f"Median: {np.median(data):.2f}")
print(f"Standard deviation: {np.std(data):.2f}")
plt.hist(data, bins=10, edgecolor="black")
plt.show()
"""
    )
    print("".join(execution.logs.stdout), end="")
    with open("histogram.png", "wb") as f:
        f.write(base64.b64decode(execution.results[0].png))
    print("histogram saved to histogram.png")

    sbx.files.write("/home/user/data.csv", "name,score\nada,91\nbob,78\n")
    execution = sbx.run_code("import pandas as pd\npd.read_csv('/home/user/data.csv').describe()")
    print(execution.text)

    execution = sbx.run_code("1 / 0")
    print("error:", execution.error.name, execution.error.value)
finally:
    sbx.kill()
