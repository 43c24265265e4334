"""A job resolved once: every decision the user's config leaves open
(:mod:`.settings`), the plan of every process (:mod:`.plan`), the directories it
writes (:mod:`.paths`) and the report of what replaced the script's settings
(:mod:`.overrides`).
"""
