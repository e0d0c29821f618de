"""Registration of the user's own classes by name, so that dnn.load can rebuild them (model files hold
settings and class names, never code): one rule for layers (`dnn.layers.register`) and learning-rate
schedules (`dnn.optim.schedules.register`)."""
from .errors import ConfigError


def register_into(kinds, built_in, base, public, what, cls):
    """Add `cls`, a proper subclass of `base`, to `kinds` under its class name and return it. A name of
    the library's own classes (`built_in`) cannot be taken; registering another class under a name
    registered before replaces it (a class defined again, as in a notebook). `public` (the base's
    public name) and `what` ('layer', 'schedule') word the errors."""
    if not (isinstance(cls, type) and issubclass(cls, base)) or cls is base:
        raise ConfigError(f"register takes a subclass of {public}, got {cls!r}")
    name = cls.__name__
    if name in built_in and built_in[name] is not cls:
        raise ConfigError(f"register: {name!r} is the name of a dnn {what}; give your {what} class another name")
    kinds[name] = cls
    return cls
