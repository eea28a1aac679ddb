"""The version of cutegen: the packages, the runtime wheel and every build stamp read it here."""

__version__ = "0.1.0"
