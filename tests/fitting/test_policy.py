"""The fitting policy a request meets: ``[fitting]``, then the model's, then the tenant's; and ``FitPolicies``, which
works each out once per configuration."""

from __future__ import annotations

from gateway.config.settings import Settings
from gateway.fitting import policy as fit_policy
from gateway.fitting.policy import FitPolicies, policy_for


def _settings(keep_model: int = 9) -> Settings:
    return Settings.model_validate({
        "fitting": {"keep_newest_turns": 2, "remedies": ["trim", "refuse"]},
        "models": {"llama3:latest": {"fitting": {"keep_newest_turns": keep_model}}},
        "tenants": {"team": {"api_keys": ["k-team-0123456789abcdef"], "fitting": {"remedies": ["refuse"]}}},
    })


def test_the_model_then_the_tenant_override_the_defaults() -> None:
    settings = _settings()
    assert policy_for(settings).keep_newest_turns == 2
    assert policy_for(settings, model="llama3").keep_newest_turns == 9  # the :latest twin
    both = policy_for(settings, tenant="team", model="llama3:latest")
    assert (both.keep_newest_turns, both.remedies) == (9, ("refuse",))
    assert policy_for(settings, tenant="someone-else", model="qwen").remedies == ("trim", "refuse")


def test_a_policy_is_worked_out_once_per_configuration() -> None:
    policies, settings = FitPolicies(), _settings()
    first = policies.get(settings, tenant="team", model="llama3")
    assert policies.get(settings, tenant="team", model="llama3") is first
    assert policies.get(settings, tenant="team", model="qwen").keep_newest_turns == 2
    reloaded = _settings(keep_model=4)  # a reload is a new snapshot: nothing of the old one is served
    assert policies.get(reloaded, tenant="team", model="llama3").keep_newest_turns == 4
    assert policies.get(settings, tenant="team", model="llama3").keep_newest_turns == 9


def test_made_up_model_names_do_not_grow_the_cache_without_bound() -> None:
    policies, settings = FitPolicies(), _settings()
    for index in range(fit_policy.POLICY_CACHE * 3):
        assert policies.get(settings, model=f"made-up-{index}").keep_newest_turns == 2
    assert len(policies._found) <= fit_policy.POLICY_CACHE
