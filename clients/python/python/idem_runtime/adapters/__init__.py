"""Framework adapters, one module each (``idem_runtime.adapters.langchain``, ...). Each imports
its framework, so import the module for the framework you use; ``idem_runtime`` itself
imports none of them."""
