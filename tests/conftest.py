import os

from hypothesis import settings

# "ci" (the default): no per-example deadline, so a slow or loaded machine does not
# turn timing noise into failures. Choose another profile with HYPOTHESIS_PROFILE=...
settings.register_profile("ci", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
