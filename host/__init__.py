"""What every process of the testbed may share, host code and emulation alike: it imports
nothing from testbed/, trainer/ or prefill/."""
