// The live view client, shared by the dashboard and the live-link page: one
// WebSocket (JPEG frames, `state` and `error` messages), and, once this
// viewer holds control, mouse and keyboard input on the picture as fractions
// of the frame (docs/api.md, "Taking control of the live view").

const BUTTONS = ['left', 'middle', 'right', 'back', 'forward'];
const modifiers = (e) => (e.altKey ? 1 : 0) | (e.ctrlKey ? 2 : 0) | (e.metaKey ? 4 : 0) | (e.shiftKey ? 8 : 0);

export class LiveView {
  // img: where frames show; area: the focusable element around it (keys);
  // onState(state | null), onError(detail), onClose(): what the page does.
  constructor({ img, area, onState = () => {}, onError = () => {}, onClose = () => {} }) {
    Object.assign(this, { img, area, onState, onError, onClose });
    this.socket = null;
    this.url = null;
    this.state = null;
    this.frameUrl = null;
    this.wireInput();
  }

  get controlling() { return this.state?.control === 'yours'; }

  open(url) {
    if (this.url === url) return;
    this.close();
    const socket = new WebSocket(url);
    socket.binaryType = 'blob';
    Object.assign(this, { socket, url });
    this.img.dataset.src = url;
    socket.onmessage = (event) => this.receive(event.data);
    socket.onclose = () => {
      if (this.socket !== socket) return;
      Object.assign(this, { socket: null, url: null, state: null });
      this.onState(null);
      this.onClose();
    };
  }

  close() {
    if (this.socket) { this.socket.onclose = null; this.socket.close(); }
    if (this.frameUrl) URL.revokeObjectURL(this.frameUrl);
    Object.assign(this, { socket: null, url: null, state: null, frameUrl: null });
    this.img.removeAttribute('src');
    delete this.img.dataset.src;
    this.onState(null);
  }

  receive(data) {
    if (typeof data !== 'string') {
      const previous = this.frameUrl;
      this.frameUrl = URL.createObjectURL(data);
      this.img.src = this.frameUrl;
      if (previous) URL.revokeObjectURL(previous);
      return;
    }
    const message = JSON.parse(data);
    if (message.type === 'state') { this.state = message; this.onState(message); }
    if (message.type === 'error') this.onError(message.detail);
  }

  send(message) {
    if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(message));
  }

  toggleControl() {
    const take = !this.controlling;
    this.send({ type: 'control', take });
    if (take) this.area.focus();
  }

  showTab(id) { this.send({ type: 'tab', id }); }

  pointer(e, event) {
    if (!this.controlling) return;
    const rect = this.img.getBoundingClientRect();
    if (!rect.width || !rect.height) return;
    e.preventDefault();
    const x = Math.min(1, Math.max(0, (e.clientX - rect.left) / rect.width));
    const y = Math.min(1, Math.max(0, (e.clientY - rect.top) / rect.height));
    const message = { type: 'mouse', event, x, y, buttons: e.buttons ?? 0, modifiers: modifiers(e) };
    if (event === 'down' || event === 'up') Object.assign(message, { button: BUTTONS[e.button] ?? 'none', click_count: e.detail || 1 });
    if (event === 'wheel') Object.assign(message, { delta_x: e.deltaX, delta_y: e.deltaY });
    this.send(message);
  }

  key(e, event) {
    if (!this.controlling) return;
    e.preventDefault();
    const text = e.key.length === 1 ? e.key : (e.key === 'Enter' ? '\r' : '');
    this.send({ type: 'key', event, key: e.key, code: e.code, key_code: e.keyCode, text, modifiers: modifiers(e) });
  }

  wireInput() {
    const { img, area } = this;
    img.addEventListener('mousedown', (e) => { area.focus(); this.pointer(e, 'down'); });
    img.addEventListener('mouseup', (e) => this.pointer(e, 'up'));
    img.addEventListener('mousemove', (e) => this.pointer(e, 'move'));
    img.addEventListener('wheel', (e) => this.pointer(e, 'wheel'), { passive: false });
    img.addEventListener('contextmenu', (e) => { if (this.controlling) e.preventDefault(); });
    area.addEventListener('keydown', (e) => this.key(e, 'down'));
    area.addEventListener('keyup', (e) => this.key(e, 'up'));
  }
}

const SIGNS = { yours: 'You have control: clicks and keys go to the page', taken: 'Someone else has control', view_only: 'View only', free: '' };

// Shows `state` in the controls: the take-control toggle, the tab switcher,
// the sign while someone else (or nobody) has control, or why the browser
// cannot be shown for now (its `notice`).
export function renderControls({ button, select, sign, area }, state) {
  const control = state?.control;
  button.disabled = !control || control === 'taken' || control === 'view_only';
  button.textContent = control === 'yours' ? 'Release control' : 'Take control';
  button.setAttribute('aria-pressed', String(control === 'yours'));
  sign.className = control ?? '';
  sign.textContent = state?.notice ?? SIGNS[control] ?? '';
  area.classList.toggle('controlling', control === 'yours');
  const tabs = state?.tabs ?? [];
  select.replaceChildren(...tabs.map((tab) => {
    const option = document.createElement('option');
    option.value = tab.id;
    option.textContent = tab.title || tab.url || tab.id;
    return option;
  }));
  if (state?.tab) select.value = state.tab;
  select.disabled = !tabs.length || control === 'taken' || control === 'view_only';
}
