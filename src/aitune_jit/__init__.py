"""Zero-code JIT tuning: the Module.__call__ patch, PatchedModule hierarchy, config and views."""
