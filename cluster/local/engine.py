"""The local engine: torchrun on this machine, each simulated node one torchrun agent.

`targetNodeCount` nodes are `targetNodeCount` torchrun agents that meet through a c10d
rendezvous on 127.0.0.1 (a free port), each starting `processesPerNode` workers — the same
elastic agent code path a real multi-node job takes, so restarts and rejoining are exercised
for real. With `"network": {"bandwidth": "1gbit"}` (root) each agent runs in its own network
namespace behind a link of that rate (`cluster.local.netns`), so ranks on different simulated nodes
talk over a real network stack, and the rendezvous is at node 0's address. With
`elastic.maxRestarts` > 0 a failed worker group is restarted (every agent
re-rendezvouses); continuing where it stopped is the job's business. A job whose workers form
no process group (`Job.process_group`: tile and predict ranks) on one node, without a network
or restarts, is run without torchrun: its ranks are started directly (`rank-<i>.log`).

Agent output (which includes the workers') goes line by line, redacted, to
`LOG_DIR/node-<i>.log`, and all but the failure noise (`cluster.output`) to
`LaunchOptions.on_output`; LOG_DIR is `logs/` in the job's output dir (or a temporary directory
when that is a URL or there is none). Workers that fail leave their one-line error in LOG_DIR
(`cluster.failures`). If any agent fails, the others are stopped and `LaunchError` gives the
first failing rank's own error line and LOG_DIR; a rank that a signal killed (it leaves no
error, and the others then fail in a collective) is the cause: "rank 1 died: killed by signal
9 (SIGKILL)", from the process's status or torchrun's root cause; else the failing node's log.
A temporary LOG_DIR is removed once the job succeeds; with `LaunchOptions.keep_logs=False`
(a caller that streams the output: `--nproc`) also when its workers refused their input (that
error is its own line, without LOG_DIR); a crash keeps it, named in the error.

The job's secret environment (the storage options) reaches the agents, and through them the
workers, only in their process environment: never in an argument, a log line or a file.
"""

from __future__ import annotations

from cluster.engine import PlanEngine
from cluster.local.agents import run_agents
from cluster.local.plan import LocalPlan, plan_local


class LocalEngine(PlanEngine[LocalPlan]):
    """torchrun on this machine; `targetNodeCount` agents simulate the nodes."""

    plan_type = LocalPlan
    make_plan = staticmethod(plan_local)
    run = staticmethod(run_agents)
