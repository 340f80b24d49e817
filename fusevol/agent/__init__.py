"""The agent's process: its lifecycle, from the launcher to the hand-over.

launcher      `fusevol run` forks the agent and holds its FUSE connection, so that a crash
              of the agent fails no read; a restarted agent takes the connection over
app           the composition root: starts the components in order, stops them
components    every long-lived component, built in dependency order and wired together
readiness     when the agent is ready: /readyz, the CSI server's probe, the ready file
lifecycle     the agent's phases and the transitions between them, in one table
lock          `<root>/fusevol/lock`: one agent reconciles a root at a time
handover      a stopping agent answers FUSE as a lame duck until its successor holds on
holder        `fusevol hold`: keeps the FUSE connection outside the agent's pod for the next agent
peers         the hand-over sockets: mode 0600 whatever the umask, and root at either end only
sdnotify      systemd's notify protocol (READY, STOPPING, watchdog, the fd store)
preflight     start-up checks: a mistake is one line, before anything is created
collector     Python's full garbage collections, at quiet moments
source_setup  which source the settings ask for, and what the agent needs of it
"""
