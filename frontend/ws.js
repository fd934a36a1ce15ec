// A WebSocket that reconnects, and on every (re)connect asks the server for what it missed.
//
//   const sock = new LiveSocket("/ws/runs/7/", {
//     onMessage: (msg) => ...,                       // one parsed JSON message
//     catchUp: () => ({type: "catch_up", ...}),      // sent after each open; null to skip
//     onState: (state) => ...,                       // "connecting" | "open" | "closed"
//   });
//
// The page's own HTML is the state as of its render; the socket only carries what is newer, and the
// catch-up request closes the gap between the render and the socket opening (or a reconnect).

export class LiveSocket {
  constructor(path, { onMessage, catchUp = null, onState = () => {} }) {
    this.path = path;
    this.onMessage = onMessage;
    this.catchUp = catchUp;
    this.onState = onState;
    this.delay = 500;
    this.closedByUs = false;
    this.connect();
  }

  url() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}${this.path}`;
  }

  connect() {
    this.onState("connecting");
    const ws = new WebSocket(this.url());
    this.ws = ws;
    ws.addEventListener("open", () => {
      this.delay = 500;
      this.onState("open");
      const request = this.catchUp && this.catchUp();
      if (request) ws.send(JSON.stringify(request));
    });
    ws.addEventListener("message", (event) => {
      let msg;
      try { msg = JSON.parse(event.data); } catch (_) { return; }
      this.onMessage(msg);
    });
    ws.addEventListener("close", () => {
      this.onState("closed");
      if (this.closedByUs) return;
      // Back off up to 15 s so a restarting server is not hammered.
      setTimeout(() => this.connect(), this.delay);
      this.delay = Math.min(this.delay * 2, 15000);
    });
  }

  close() {
    this.closedByUs = true;
    this.ws && this.ws.close();
  }
}

export function showConnState(el) {
  return (state) => {
    if (!el) return;
    el.dataset.state = state;
    el.textContent = `live: ${state === "open" ? "connected" : state}`;
  };
}
