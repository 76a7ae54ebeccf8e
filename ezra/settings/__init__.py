"""The grammars of what can be set: each parses its words once and says what is wrong.

options.py is the one option parser the commands declare their options for; queue_settings.py
reads a queue's settings (XCFGSET, the config file's `queue` lines); schedule_settings.py reads
a schedule's definition (XSCHEDULE SET, the config file's `schedule` lines) and cron.py its
times; trimming.py reads XADD's and XTRIM's MAXLEN, MINID and LIMIT. Parsing only: applying a
setting is the broker's.
"""
