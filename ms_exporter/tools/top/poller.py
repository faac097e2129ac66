"""`top`'s polling: every target fetched at once in a thread pool, its pages made into rows."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import replace

from ms_exporter.core.stall import STALE_SECONDS
from ms_exporter.tools.rank_samples import parse_ranks
from ms_exporter.tools.scrape import Access, FetchError, fetch
from ms_exporter.tools.targets import TargetSpec, expand_targets
from ms_exporter.tools.top.rows import (
    History,
    Row,
    build_row,
    down_row,
    gone_rows,
    mark_diverged,
    mark_failslow,
    mark_slowest,
    sort_key,
)


class Poller:
    """Polls every target at once in a thread pool: a rank that hangs costs one slot and shows DOWN, and is not
    asked again until its request ends, while the others are shown as usual."""

    def __init__(
        self,
        specs: Sequence[TargetSpec],
        access: Access | None = None,
        scheme: str = "http",
        stale_seconds: float = STALE_SECONDS,
        fetcher: Callable[[str, Access], str] = fetch,
        clock: Callable[[], float] = time.time,
        max_workers: int = 32,
    ) -> None:
        self._specs = list(specs)
        self._access = access or Access()
        self._scheme = scheme
        self._stale_seconds = stale_seconds
        self._fetch = fetcher
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="ms-exporter-top")
        self._pending: dict[str, Future[str]] = {}
        self._histories: dict[tuple[str, str, str], History] = {}
        # Ranks whose target left discovery (a file_sd file removed) before they said they ended: shown DOWN until
        # the same project and rank report again.
        self._vanished: dict[tuple[str, str], Row] = {}

    def poll(self) -> list[Row]:
        targets = expand_targets(self._specs, self._scheme)
        for target in targets:
            if target.problem is None and target.url not in self._pending:
                self._pending[target.url] = self._executor.submit(self._fetch, target.url, self._access)
        waiting = [self._pending[t.url] for t in targets if t.problem is None]
        # urllib's timeout is per socket operation: a page that trickles in could take longer; the poll does not.
        wait_for(waiting, timeout=self._access.timeout + 0.5)
        now = self._clock()
        rows: list[Row] = []
        for target in targets:
            if target.problem is not None:
                rows.append(down_row(target, target.problem))
                continue
            future = self._pending[target.url]
            if not future.done():
                rows.append(down_row(target, f"no answer within {self._access.timeout:g}s"))
                continue
            del self._pending[target.url]
            try:
                groups = parse_ranks(future.result())
            except FetchError as exc:
                rows.extend(gone_rows(target.url, self._histories, str(exc)) or [down_row(target, str(exc))])
                continue
            except Exception as exc:  # the parser's errors are ValueErrors and worse: all mean "not our page"
                rows.append(down_row(target, f"not the Prometheus text format: {exc}"))
                continue
            if not groups:
                rows.append(down_row(target, "no series with a rank label: not an ms_exporter endpoint?"))
                continue
            for (project, rank), samples in groups.items():
                key = (target.url, project, rank)
                row, self._histories[key] = build_row(
                    target.url, project, rank, samples, self._histories.get(key), now, self._stale_seconds
                )
                rows.append(row)
        urls = {target.url for target in targets}
        for key, history in self._histories.items():
            if key[0] not in urls and history.row is not None and not history.row.ended:
                self._vanished[key[1:]] = replace(history.row, error="left discovery without ending")
        self._histories = {key: value for key, value in self._histories.items() if key[0] in urls}
        reporting = {(row.project, row.rank) for row in rows if row.error is None}
        self._vanished = {key: row for key, row in self._vanished.items() if key not in reporting}
        rows.extend(self._vanished.values())
        return mark_failslow(mark_diverged(mark_slowest(sorted(rows, key=sort_key))))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
