// An MCP snapshot of a Firefox page, which has no accessibility tree over
// WebDriver BiDi: roles and names are computed here from the DOM (ARIA
// roles, the implicit roles of HTML elements, names from labels, alt text,
// ARIA attributes and content), in the node shape of Chromium's
// `Accessibility.getFullAXTree`, so that one renderer serves both engines.
//
// Each element shown gets a reference number, kept in a registry on the
// document for the steps that follow (`protocols::firefox_page_ops`):
// numbers new to this snapshot count up from `next`, which the node keeps
// per instance, so that a number never names two elements of the instance's
// documents. Answers `{next, nodes}`.
(next, limit) => {
  const key = Symbol.for('flotilla.refs');
  let refs = document[key];
  if (!refs || !(refs.byRef instanceof Map) || !(refs.refOf instanceof WeakMap)) {
    refs = { byRef: new Map(), refOf: new WeakMap() };
    Object.defineProperty(document, key, { value: refs, configurable: true });
  }
  for (const [number, held] of refs.byRef) {
    if (held.deref() === undefined) refs.byRef.delete(number);
  }
  const refOf = (element) => {
    let number = refs.refOf.get(element);
    if (number === undefined) {
      number = next++;
      refs.refOf.set(element, number);
      refs.byRef.set(number, new WeakRef(element));
    }
    return number;
  };

  const SKIP = new Set(['script', 'style', 'noscript', 'template', 'head', 'meta', 'link', 'title', 'base']);
  const LEVELS = { h1: 1, h2: 2, h3: 3, h4: 4, h5: 5, h6: 6 };
  const FROM_CONTENT = new Set(['button', 'link', 'heading', 'option', 'cell', 'columnheader',
    'rowheader', 'checkbox', 'radio', 'tab', 'menuitem', 'menuitemcheckbox', 'menuitemradio',
    'treeitem', 'switch', 'tooltip']);
  const PASS = new Set(['generic', 'none']);
  const clip = (text) => {
    const flat = String(text || '').slice(0, 4000).replace(/\s+/g, ' ').trim();
    return flat.length > 500 ? flat.slice(0, 500) + '…' : flat;
  };
  // An element's text, read up to a budget (a name needs no more; a large
  // subtree is not read whole for each of its ancestors).
  // Read as shown: an open shadow root's nodes, a slot's assigned ones.
  const textOf = (root) => {
    let text = '';
    let visits = 0;
    const walk = (node) => {
      if (text.length >= 2000 || ++visits > 5000) return;
      if (node.nodeType === Node.TEXT_NODE) text += node.data.slice(0, 2000);
      if (node.nodeType !== Node.ELEMENT_NODE || SKIP.has(node.localName)) return;
      for (const child of childrenOf(node)) walk(child);
    };
    walk(root);
    return clip(text);
  };

  const inputRole = (element) => {
    const type = (element.getAttribute('type') || 'text').toLowerCase();
    switch (type) {
      case 'button': case 'submit': case 'reset': case 'image': case 'file': case 'color':
        return 'button';
      case 'checkbox': return 'checkbox';
      case 'radio': return 'radio';
      case 'range': return 'slider';
      case 'number': return 'spinbutton';
      case 'hidden': return 'none';
      case 'search': return element.hasAttribute('list') ? 'combobox' : 'searchbox';
      default: return element.hasAttribute('list') ? 'combobox' : 'textbox';
    }
  };
  const IMPLICIT = {
    button: 'button', summary: 'button', textarea: 'textbox', option: 'option', ul: 'list',
    ol: 'list', menu: 'list', li: 'listitem', nav: 'navigation', main: 'main', header: 'banner',
    footer: 'contentinfo', aside: 'complementary', form: 'form', article: 'article',
    table: 'table', tr: 'row', td: 'cell', th: 'columnheader', p: 'paragraph', dialog: 'dialog',
    fieldset: 'group', details: 'group', progress: 'progressbar', meter: 'meter',
    hr: 'separator', blockquote: 'blockquote', figure: 'figure', iframe: 'Iframe',
  };
  const roleOf = (element) => {
    const explicit = (element.getAttribute('role') || '').trim().split(/\s+/)[0];
    if (explicit) return explicit === 'presentation' ? 'none' : explicit;
    if (!(element instanceof HTMLElement)) return 'generic';
    const tag = element.localName;
    if (LEVELS[tag]) return 'heading';
    switch (tag) {
      case 'a': case 'area': return element.hasAttribute('href') ? 'link' : 'generic';
      case 'input': return inputRole(element);
      case 'select': return element.multiple || element.size > 1 ? 'listbox' : 'combobox';
      case 'img': return element.getAttribute('alt') === '' ? 'none' : 'img';
      case 'section': return element.hasAttribute('aria-label') || element.hasAttribute('aria-labelledby') ? 'region' : 'generic';
      default: return IMPLICIT[tag] || 'generic';
    }
  };

  const CONTROLS = 'input, select, textarea, button';
  // A label's text without the controls in it (`<label>Name <input></label>`
  // names the input "Name").
  const labelText = (label) => {
    let text = '';
    const walk = (node) => {
      if (text.length > 2000) return;
      if (node.nodeType === Node.TEXT_NODE) text += node.data.slice(0, 2000);
      if (node.nodeType !== Node.ELEMENT_NODE || SKIP.has(node.localName) || node.matches(CONTROLS)) return;
      for (const child of node.childNodes) walk(child);
      text += ' ';
    };
    for (const child of label.childNodes) walk(child);
    return text;
  };
  const nameOf = (element, role) => {
    const labelledby = element.getAttribute('aria-labelledby');
    if (labelledby) {
      const text = clip(labelledby.split(/\s+/).slice(0, 20).map((id) => document.getElementById(id))
        .filter(Boolean).map(textOf).join(' '));
      if (text) return text;
    }
    const label = clip(element.getAttribute('aria-label'));
    if (label) return label;
    const tag = element.localName;
    if (tag === 'input' || tag === 'textarea' || tag === 'select') {
      const type = (element.getAttribute('type') || '').toLowerCase();
      if (['button', 'submit', 'reset'].includes(type)) {
        return clip(element.value || { submit: 'Submit', reset: 'Reset' }[type] || '');
      }
      if (type === 'image') return clip(element.getAttribute('alt') || element.value || 'Submit');
      const labels = clip([...(element.labels || [])].map(labelText).join(' '));
      if (labels) return labels;
      return clip(element.getAttribute('title') || element.getAttribute('placeholder'));
    }
    if (tag === 'img' || tag === 'area') return clip(element.getAttribute('alt') || element.getAttribute('title'));
    const caption = { fieldset: ':scope > legend', table: ':scope > caption', figure: ':scope > figcaption' }[tag];
    const captioned = caption && element.querySelector(caption);
    if (captioned) return textOf(captioned);
    if (FROM_CONTENT.has(role)) {
      const text = textOf(element);
      if (text) return text;
    }
    return clip(element.getAttribute('title'));
  };
  const valueOf = (element, role) => {
    if (!['textbox', 'searchbox', 'spinbutton', 'slider', 'combobox'].includes(role)) return '';
    if (element instanceof HTMLSelectElement) return clip(element.selectedOptions[0]?.label);
    if (element instanceof HTMLTextAreaElement) return clip(element.value);
    if (element instanceof HTMLInputElement && element.type !== 'password') return clip(element.value);
    return '';
  };
  const propertiesOf = (element, role) => {
    const properties = [];
    const add = (name, value) => properties.push({ name, value: { value } });
    const aria = (name) => element.getAttribute('aria-' + name);
    if (role === 'heading') add('level', LEVELS[element.localName] || Number(aria('level')) || 2);
    if (element instanceof HTMLInputElement && ['checkbox', 'radio'].includes(element.type)) {
      add('checked', element.indeterminate ? 'mixed' : element.checked);
    } else if (aria('checked')) {
      add('checked', aria('checked'));
    }
    if (element.matches(':disabled') || aria('disabled') === 'true') add('disabled', true);
    if (element.localName === 'summary' && element.parentElement instanceof HTMLDetailsElement) {
      add('expanded', element.parentElement.open);
    } else if (aria('expanded')) {
      add('expanded', aria('expanded'));
    }
    if (element instanceof HTMLOptionElement) add('selected', element.selected);
    else if (aria('selected')) add('selected', aria('selected'));
    if (aria('pressed')) add('pressed', aria('pressed'));
    return properties;
  };
  // The children as shown: an open shadow root's, a slot's assigned ones.
  const childrenOf = (element) => {
    if (element.shadowRoot) return element.shadowRoot.childNodes;
    if (element.localName === 'slot') {
      const assigned = element.assignedNodes({ flatten: true });
      if (assigned.length) return assigned;
    }
    return element.childNodes;
  };

  const nodes = [{ nodeId: '0', role: { value: 'RootWebArea' }, name: { value: clip(document.title) }, childIds: [] }];
  // (DOM node, parent's index in nodes, whether it is hidden by visibility)
  const stack = document.documentElement ? [[document.documentElement, 0, false]] : [];
  while (stack.length && nodes.length < limit) {
    const [node, parent, hiddenAbove] = stack.pop();
    const id = String(nodes.length);
    if (node.nodeType === Node.TEXT_NODE) {
      const text = clip(node.data);
      if (!text) continue;
      nodes[parent].childIds.push(id);
      nodes.push({ nodeId: id, parentId: nodes[parent].nodeId, role: { value: 'StaticText' }, name: { value: text }, ignored: hiddenAbove, childIds: [] });
      continue;
    }
    if (node.nodeType !== Node.ELEMENT_NODE || SKIP.has(node.localName)) continue;
    if (node.getAttribute('aria-hidden') === 'true') continue;
    const inSelect = node.localName === 'option' || node.localName === 'optgroup';
    if (!inSelect && !node.checkVisibility()) {
      // No box of its own, but its children have theirs (a slot, a wrapper
      // of `display: contents`): they are read in its place.
      if (getComputedStyle(node).display === 'contents') {
        const children = [...childrenOf(node)];
        for (let i = children.length - 1; i >= 0; i--) stack.push([children[i], parent, hiddenAbove]);
      }
      continue;
    }
    const hidden = !inSelect && !node.checkVisibility({ visibilityProperty: true });
    let role = roleOf(node);
    const entry = { nodeId: id, parentId: nodes[parent].nodeId, role: { value: role }, ignored: hidden, childIds: [] };
    if (!hidden && !PASS.has(role)) {
      try {
        entry.name = { value: nameOf(node, role) };
        entry.value = { value: valueOf(node, role) };
        entry.properties = propertiesOf(node, role);
        entry.backendDOMNodeId = refOf(node);
      } catch (error) {
        // An element the rules above do not fit is passed through.
        role = 'generic';
        entry.role = { value: role };
      }
    }
    nodes[parent].childIds.push(id);
    nodes.push(entry);
    const index = nodes.length - 1;
    const children = [...childrenOf(node)];
    for (let i = children.length - 1; i >= 0; i--) stack.push([children[i], index, hidden]);
  }
  return { next, nodes };
}
