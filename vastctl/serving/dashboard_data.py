"""What the dashboard's page is built from: overview's figures and the few the dashboard adds (dashboard.page_data
reads them; dashboard_page, dashboard_cards and dashboard_tables render them), and the one-line flash an action
leaves for the page after its redirect."""

from __future__ import annotations

from typing import Literal, TypedDict

from vastctl.facts.cost import CostView
from vastctl.facts.machine_logs import RecentLog
from vastctl.views.fleet import RouterStatus
from vastctl.views.overview import Overview


class AgentLimits(TypedDict):
    """The agent's settings the page's figures are read against."""

    max_wait_s: float
    min_machines: int
    interval_s: float


class Idle(TypedDict):
    """$/h billed by what proves nothing and is not booting (dashboard._idle)."""

    stopped: float
    lost: float


class PageData(Overview):
    """overview.overview()'s figures and what the dashboard adds to them (dashboard.page_data)."""

    cost: CostView  # `vastctl cost`
    cost_day: CostView  # `vastctl cost --since 24h`
    spent_today: float
    warm: int  # machines proving or booting (guard.warm)
    agent: AgentLimits
    idle: Idle
    router: RouterStatus | None  # None when no router runs and none ran in the last day
    logs: list[RecentLog]


class Override(TypedDict):
    """The second step offered after a kill the guard refused under a rule an operator may force past."""

    instance: str
    reason: str
    limit: str


class _Flash(TypedDict):
    kind: Literal["ok", "error"]
    text: str


class Flash(_Flash, total=False):
    """An action's outcome, carried in a signed cookie across the redirect (dashboard.Web.sign_flash)."""

    override: Override
