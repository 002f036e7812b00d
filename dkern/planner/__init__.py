"""Before a run, its predicted time and per-worker memory (``dkern plan``).

A plan counts the passes a solver makes over the data (:mod:`.passes`, from the solvers'
code), prices each with this machine's measured rates (:mod:`.rates`, measured once by
:func:`.measure.calibrate` and stored in dkern's cache folder), and adds up what one
worker holds at its peak (:mod:`.costs`). It sits after the models in dkern's layers: it
reads the solvers' and estimators' constants so that the plan follows the code it models.
"""

from __future__ import annotations

from .costs import Cluster, Data, Phase, Plan
from .measure import calibrate
from .plan import default_centers, iteration_estimate, plan_fit, plan_predict
from .rates import Rates, load_rates, rates_path, save_rates

__all__ = ["Cluster", "Data", "Phase", "Plan", "Rates", "calibrate", "default_centers",
           "iteration_estimate", "load_rates", "plan_fit", "plan_predict", "rates_path",
           "save_rates"]
