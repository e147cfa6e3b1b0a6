package ipset

// Observe installs a hook that sees every request the client sends: its
// command name and how many entries it carries. Tests count messages with
// it.
func Observe(c *Client, f func(cmd string, entries int)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.observe = func(cmd uint8, entries int) { f(commandNames[cmd], entries) }
}

var commandNames = map[uint8]string{
	cmdProtocol: "protocol", cmdCreate: "create", cmdDestroy: "destroy", cmdFlush: "flush",
	cmdList: "list", cmdAdd: "add", cmdDel: "del", cmdTest: "test", cmdType: "type",
}
