"""Routing by memory between backends that serve the same model: rank.py (pure ranking), sticky.py (conversations
and their prompt caches), outages.py (backends taken out after failing), router.py (the I/O around them)."""

from gateway.routing.rank import CandidateView, LoadCost, Ranked, Standing, rank
from gateway.routing.router import ROUTE_HEADER, BackendFailed, RouteCollector, RoutePlan, Router

__all__ = ["ROUTE_HEADER", "BackendFailed", "CandidateView", "LoadCost", "Ranked", "RouteCollector", "RoutePlan",
           "Router", "Standing", "rank"]
