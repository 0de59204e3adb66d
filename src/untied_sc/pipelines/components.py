"""
The package's component classes under one library name, beside the diffusers base classes that diffusers looks up in
a component's library to pick its loading method (`ModelMixin`, `SchedulerMixin`).

`LanguageFlowPipeline.load_config` names this module as the library of each component whose folder holds our module
file (see `remote_code.py`): diffusers then takes the package's class from here, instead of importing that file as
remote code (which needs `trust_remote_code` and several processes loading at once would race on).
"""

from diffusers import ModelMixin, SchedulerMixin
from diffusers.configuration_utils import ConfigMixin

from .. import models, schedulers
from ..calibration import ace


BASES = {cls.__name__: cls for cls in (ConfigMixin, ModelMixin, SchedulerMixin)}
CLASSES = {
    name: value
    for module in (models, schedulers, ace)
    for name, value in vars(module).items()
    if isinstance(value, type) and value.__module__.startswith("untied_sc.")
}
globals().update(BASES | CLASSES)
