"""The seed tutorial's CSV pipeline, unchanged, on Glovebox's default deny-all network (asked
for explicitly: the E2B SDK's own default is internet access): upload a CSV, `pip install pandas matplotlib seaborn` inside the sandbox (satisfied offline: the
code-interpreter template has them), agent code using pandas + seaborn that saves
/home/user/plot.png, then download the plot."""

from e2b_code_interpreter import Sandbox

from checks import check, done

rows = ["city,month,sales"] + [f"{c},{m},{(i * 37 + m * 11) % 200}" for i, c in enumerate(["oslo", "lima", "pune"]) for m in range(1, 13)]
csv = "\n".join(rows) + "\n"

sbx = Sandbox.create(timeout=300, allow_internet_access=False)
# Deny-all is a network namespace with loopback only (checked without sending a packet).
links = sbx.commands.run("cat /proc/net/dev")
names = [line.split(":")[0].strip() for line in links.stdout.splitlines()[2:]]
check("the sandbox has only loopback", names == ["lo"], links.stdout)
info = sbx.files.write("/home/user/sales.csv", csv)
check("the CSV is uploaded", info.path == "/home/user/sales.csv", info)

install = sbx.commands.run("pip install pandas matplotlib seaborn", timeout=120)
check("pip install exits 0 offline", install.exit_code == 0, (install.exit_code, install.stderr))
check("pip finds them installed", "Requirement already satisfied: seaborn" in install.stdout, install.stdout)

agent_code = """
import pandas as pd
import seaborn as sns
import matplotlib.pyplot as plt

df = pd.read_csv("/home/user/sales.csv")
summary = df.groupby("city")["sales"].sum().sort_values()
print(summary.to_string())
ax = sns.barplot(data=df, x="city", y="sales", estimator="sum", errorbar=None)
ax.set_title("Sales by city")
plt.savefig("/home/user/plot.png", dpi=80)
len(df)
"""
execution = sbx.run_code(agent_code)
check("the agent code runs", execution.error is None, execution.error)
check("pandas summarised the CSV", "oslo" in "".join(execution.logs.stdout), execution.logs.stdout)
check("the last expression is the row count", execution.text == "36", execution.text)

png = sbx.files.read("/home/user/plot.png", format="bytes")
check("plot.png downloads as a PNG", bytes(png[:8]) == b"\x89PNG\r\n\x1a\n" and len(png) > 3000, len(png))

sbx.kill()
done("csv pipeline")
