-- Listen on a channel: LISTEN takes no parameter, so the channel is composed in as a quoted identifier.
LISTEN {channel}
