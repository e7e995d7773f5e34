"""nvidia-cuda-mps-control faked at the subprocess boundary (there is no GPU nor MPS here), for the
GPU Manager's per-unit daemons and the profiling runs' `MPSSession` alike: both go through
faas_gpu.mps's one runner and one `Processes`."""

from __future__ import annotations

from faas_gpu.mps import Processes, RunResult, Timeouts


class FakeRunner:
    """nvidia-cuda-mps-control faked at the subprocess boundary, per pipe directory as the real one:
    `-d` starts a control daemon; a command through the pipe reaches it only while it runs (else it
    fails as the client does when no daemon answers); `quit` ends it unless `stubborn` (clients that
    do not exit: `quit -t` ends it unless `stubborn == "always"`); `silent` pipes never answer.
    `reply`, when set, answers every command instead. Records each command (argv, the MPS part of
    its env, its stdin) in `calls` and `events`."""

    def __init__(self, events: list | None = None):
        self.calls: list[tuple[list[str], dict[str, str], str | None]] = []
        self.events = events if events is not None else []
        self.reply: RunResult | None = None
        self.up: set[str] = set()  # pipe directories with a control daemon
        self.servers = ""  # get_server_list's answer
        self.stubborn: bool | str = False
        self.silent = False

    def __call__(self, argv: list[str], env: dict[str, str], input: str | None = None) -> RunResult:
        mine = {k: v for k, v in env.items() if k.startswith("CUDA_")}
        self.calls.append((argv, mine, input))
        self.events.append(("mps", mine.get("CUDA_VISIBLE_DEVICES"), input or " ".join(argv[1:])))
        if self.reply is not None:
            return self.reply
        pipe = mine["CUDA_MPS_PIPE_DIRECTORY"]
        if argv[1:] == ["-d"]:
            if pipe in self.up:
                return RunResult(1, "", "An instance of this daemon is already running")
            self.up.add(pipe)
            return RunResult(0)
        if pipe not in self.up or self.silent:
            return RunResult(1, "", "Cannot find MPS control daemon process")
        command = (input or "").strip()
        if command == "quit" and not self.stubborn or command.startswith("quit -t") and self.stubborn != "always":
            self.up.discard(pipe)
        return RunResult(0, self.servers + "\n" if command == "get_server_list" else "")

    def commands(self) -> list[str]:
        return [c[2].strip() if c[2] else " ".join(c[0][1:]) for c in self.calls]


NO_PIDS = Processes(find=lambda _pipe: None)  # the fake's daemons: no pid in /proc; gone = silent pipe

FAST = Timeouts(answer_s=0.05, quit_wait_s=0.01, quit_timeout_s=0.02, kill_wait_s=0.01, poll_s=0.001)


class FakePids(Processes):
    """The control daemon as a process: pid 777 lives while the fake runner's daemon (of the last
    pipe directory asked about) is up; a signal ends it (and its servers) unless `unkillable`."""

    def __init__(self, runner: FakeRunner):
        super().__init__(find=self._find, alive=self._alive, kill=self._kill, sleep=lambda _s: None)
        self.runner, self.pipe, self.unkillable = runner, "", False
        self.signals: list[tuple[int, int]] = []

    def _find(self, pipe_dir) -> int:
        self.pipe = str(pipe_dir)
        return 777

    def _alive(self, pid: int) -> bool:
        return self.pipe in self.runner.up

    def _kill(self, pid: int, sig: int) -> None:
        self.signals.append((pid, sig))
        if pid == 777 and not self.unkillable:
            self.runner.up.discard(self.pipe)
