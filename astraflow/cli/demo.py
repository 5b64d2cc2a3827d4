"""`astraflow demo`: the dataflow spine end to end on the embedded bus.

A producer releases arithmetic tasks to ``tasks``; three rollout-like worker *processes* form
the run's rollout consumer group and answer each task with a trajectory on ``trajectories``;
midway one worker is killed with SIGKILL. Its partitions move to the others after the session
timeout and its uncommitted tasks are redelivered, so every task still gets its trajectory.
A short tour of the bus's guarantees without torch; the main job is ``astraflow run``
(``scripts/quickstart.sh``).
"""

from __future__ import annotations

import random
import shutil
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

SESSION_TIMEOUT = 3.0


def _topics(run: str) -> dict[str, int]:
    from astraflow.core.topics import topic_name

    return {topic_name(run, "tasks"): 8, topic_name(run, "trajectories"): 8,
            topic_name(run, "dlq"): 1, topic_name(run, "metrics"): 1}


def worker(url: str, run: str, worker_id: str, delay: float) -> None:
    """One worker process: consume tasks, answer them, produce trajectories (until SIGTERM)."""
    from astraflow.core.bus import connect
    from astraflow.core.bus.types import Message
    from astraflow.core.records import Task, Trajectory, pack_f32, pack_i32, pack_u8
    from astraflow.core.stream import Output, run_processor
    from astraflow.core.topics import group_name, route, topic_name

    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    rng = random.Random(worker_id)

    def answer(task: Task, msg: Message) -> list[Output]:
        t0 = time.monotonic()
        time.sleep(delay)  # stands in for generation
        a, b = (int(x) for x in task.prompt[-1].content.rstrip("=").split("+"))
        guess = a + b if rng.random() < 0.8 else a + b + rng.choice([-1, 1])
        prompt = [ord(c) for c in task.prompt[-1].content]
        completion = [ord(c) for c in str(guess)]
        n, m = len(prompt), len(completion)
        tr = Trajectory(
            id=f"{task.resolved_group_id()}/0", task_id=task.id, group_id=task.resolved_group_id(),
            token_ids=pack_i32(prompt + completion), loss_mask=pack_u8([0] * n + [1] * m),
            logprobs=pack_f32([0.0] * n + [-0.1] * m), versions=pack_i32([-1] * n + [0] * m),
            prompt_len=n, reward=float(guess == int(task.reference["answer"])),
            worker_id=worker_id, timings={"total": time.monotonic() - t0})
        out_topic, key = route(run, tr)
        return [Output(out_topic, tr, key)]

    bus = connect(url)
    run_processor(bus, group=group_name(run, "rollout"), inputs=[topic_name(run, "tasks")],
                  kind=Task, handle=answer, dlq=topic_name(run, "dlq"), component=worker_id,
                  batch_size=4, poll_timeout=0.2, session_timeout=SESSION_TIMEOUT,
                  should_stop=lambda: stop)
    bus.close()


def demo(
    out: Annotated[Path, typer.Option(help="Run directory (the embedded bus file lives here).")]
    = Path("runs/bus-demo"),
    tasks: Annotated[int, typer.Option(min=1, help="Tasks to produce.")] = 600,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 3,
    kill: Annotated[bool, typer.Option(help="SIGKILL one worker midway.")] = True,
    delay: Annotated[float, typer.Option(help="Seconds of 'generation' per task.")] = 0.01,
    bus: Annotated[str | None, typer.Option(help="Bus URL (default: embedded in --out).")]
    = None,
) -> None:
    """A producer and worker processes on the bus; one worker is killed; nothing is lost."""
    from rich.console import Console
    from rich.live import Live
    from rich.markup import escape
    from rich.table import Table

    from astraflow.core.bus import connect, embedded_url
    from astraflow.core.launcher import Child, cli, role_env, stop_all
    from astraflow.core.records import ChatMessage, Task, Trajectory, decode
    from astraflow.core.stream import Output, send
    from astraflow.core.topics import group_name, record_key, topic_name

    console = Console()
    if bus is None:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        bus = embedded_url(out.resolve() / "bus.db")
    run = f"demo-{uuid.uuid4().hex[:6]}"
    b = connect(bus)
    b.create_topics(_topics(run))
    tasks_topic, traj_topic = topic_name(run, "tasks"), topic_name(run, "trajectories")
    procs: dict[str, Child] = {}
    for i in range(workers):  # each in its own session, logging to out/logs/worker-<i>.log
        child = procs[f"worker-{i}"] = Child(out / "logs" / f"worker-{i}.log")
        child.start(cli("demo-worker", bus, run, f"worker-{i}", "--delay", str(delay)),
                    role_env())
    console.print(f"[bold]bus[/] {escape(bus)}   [bold]run[/] {run}   "
                  f"[bold]workers[/] {', '.join(f'{k} (pid {p.pid})' for k, p in procs.items())}")
    producer = b.producer(client_id="demo-producer")
    reader = b.reader(traj_topic, client_id="demo")
    rng = random.Random(0)
    per_worker: Counter[str] = Counter()
    per_task: Counter[str] = Counter()
    rewards: list[float] = []
    produced = 0
    killed: str | None = None
    t0 = time.monotonic()

    def table() -> Table:
        t = Table(title=f"tasks → rollout group ({workers} processes) → trajectories")
        for col in ("worker", "pid", "state", "trajectories"):
            t.add_column(col, justify="right" if col in ("pid", "trajectories") else "left")
        for name, p in procs.items():
            state = ("[red]killed (SIGKILL)" if name == killed
                     else "[green]running" if p.poll() is None else f"exited {p.poll()}")
            t.add_row(name, str(p.pid), state, str(per_worker[name]))
        lag = sum(b.lag(group_name(run, "rollout"), tasks_topic).values())
        t.caption = (f"produced {produced}/{tasks}  answered {len(per_task)}  "
                     f"redelivered {sum(per_task.values()) - len(per_task)}  lag {lag}  "
                     f"reward {sum(rewards) / max(1, len(rewards)):.2f}  "
                     f"{time.monotonic() - t0:.1f}s")
        return t

    deadline = time.monotonic() + 120 + tasks * delay
    with Live(table(), console=console, refresh_per_second=8) as live:
        while len(per_task) < tasks and time.monotonic() < deadline:
            if all(p.poll() is not None for p in procs.values()):
                break  # every worker is gone: report below
            for _ in range(min(20, tasks - produced)):
                a, c = rng.randrange(100), rng.randrange(100)
                task = Task(id=f"t{produced:05d}", dataset="demo-add",
                            prompt=[ChatMessage(role="user", content=f"{a}+{c}=")],
                            reference={"answer": a + c})
                send(producer, Output(tasks_topic, task, record_key("tasks", task)))
                produced += 1
            producer.flush()
            for m in reader.consume(200, 0.05):
                tr = decode(m.value, Trajectory)
                per_worker[tr.worker_id] += 1
                per_task[tr.task_id] += 1
                rewards.append(tr.reward)
            if kill and killed is None and len(per_task) >= tasks // 3:
                killed = "worker-0"
                procs[killed].signal(signal.SIGKILL)
            live.update(table())
    codes = dict(zip(procs, stop_all(procs.values(), 30.0), strict=True))
    for p in procs.values():
        p.close()
    reader.close()
    producer.close()
    lost = tasks - len(per_task)
    dup = sum(per_task.values()) - len(per_task)
    elapsed = time.monotonic() - t0
    console.print(
        f"\n[bold]{len(per_task)}/{tasks}[/] tasks answered in {elapsed:.1f}s "
        f"({len(per_task) / elapsed:.0f} tasks/s); lost [bold]{lost}[/]; redelivered after the "
        f"kill {dup} (at-least-once; downstream dedups by record id); exit codes {codes}")
    b.close()
    bad_exit = [n for n, c in codes.items() if n != killed and c != 0]
    if lost or bad_exit:
        for n in bad_exit:
            console.print(f"[red]{n} exited {codes[n]}:[/]\n{escape(procs[n].tail(30))}")
        raise typer.Exit(1)
