"""`Checked`: a setting of a layer or a loss scale checked at every assignment, the constructor's included."""


class Checked:
    """A setting checked whenever it is set: by the constructor and by an assignment between fits
    alike (`check(value)` returns the value to keep or raises ConfigError), kept in `_<name>`. A
    plain attribute took a bad value assigned after construction (BatchNorm's eps = -1, Dropout's
    p = 2, a loss scale's init_scale = 1e39) as it was; the recorded steps are keyed on the settings
    (a layer's get_config(), the loss scale's), so a good one takes effect at the next step."""

    def __init__(self, check):
        self.check = check

    def __set_name__(self, owner, name):
        self.slot = "_" + name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj, self.slot)

    def __set__(self, obj, value):
        setattr(obj, self.slot, self.check(value))
