"""Rewards: composable sources over a stored trajectory, registered like envs (decorator + "agentrl.rewards" entry
points). Imports only types (and errors).

    base.py        RewardSource (one unweighted value per trajectory) and its options model
    registry.py    @register_reward, entry points, lookup
    spec.py        `reward:` entries (YAML shorthand -> RewardSpec), validated at config load
    scorer.py      Scorer: weighted sum, `reward_components`, infra_error stays unscored
    unit_tests.py  `unit_tests` (default), `length_penalty`     format.py  `format`
    http.py        `http`: an external reward-model service     server.py  its reference stand-in server
"""

from agentrl.reward.base import PromptMessages, RewardSource, SourceOptions
from agentrl.reward.format import Format, format_followed
from agentrl.reward.http import HttpReward, RewardRequest, RewardServiceError
from agentrl.reward.registry import available_rewards, register_reward, reward_class
from agentrl.reward.scorer import Scorer, recorded_specs
from agentrl.reward.spec import DEFAULT_REWARD, RewardSpec, check_reward_list, parse_reward_list
from agentrl.reward.unit_tests import LengthPenalty, UnitTests, length_shaped, score, unit_test_fraction

__all__ = ["DEFAULT_REWARD", "Format", "HttpReward", "LengthPenalty", "PromptMessages", "RewardRequest",
           "RewardServiceError", "RewardSource", "RewardSpec", "Scorer", "SourceOptions", "UnitTests",
           "available_rewards", "check_reward_list", "format_followed", "length_shaped", "parse_reward_list",
           "recorded_specs", "register_reward", "reward_class", "score", "unit_test_fraction"]
