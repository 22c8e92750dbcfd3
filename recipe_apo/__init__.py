"""recipe-apo: Adaptive Policy Optimization (APO) for verl.

Importing the package imports nothing: verl registers the recipe's estimators and losses through the
``verl.plugins`` entry point (``recipe_apo.plugin``), and the recipe's own entry points import the plugin. So the
vLLM plugin entry point (``recipe_apo.cpu.vllm_engine``), which vLLM loads in every process it starts, loads
neither verl nor the methods.
"""

__version__ = "0.1.0"
