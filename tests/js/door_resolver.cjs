// Preloaded with `node --require`: names under a test domain (FLOTILLA_TEST_DOMAIN,
// e.g. browsers.test) resolve to 127.0.0.1, as a wildcard DNS record would.
const dns = require('node:dns');
const domain = process.env.FLOTILLA_TEST_DOMAIN;
const lookup = dns.lookup;
dns.lookup = function (hostname, options, callback) {
  if (typeof options === 'function') {
    callback = options;
    options = {};
  }
  if (domain && typeof hostname === 'string' && hostname.toLowerCase().endsWith('.' + domain)) {
    const all = typeof options === 'object' && options && options.all;
    return process.nextTick(() =>
      all ? callback(null, [{ address: '127.0.0.1', family: 4 }]) : callback(null, '127.0.0.1', 4),
    );
  }
  return lookup.call(this, hostname, options, callback);
};
const promisesLookup = dns.promises.lookup;
dns.promises.lookup = function (hostname, options) {
  if (domain && typeof hostname === 'string' && hostname.toLowerCase().endsWith('.' + domain)) {
    const all = typeof options === 'object' && options && options.all;
    const v6Only = typeof options === 'object' && options && options.family === 6;
    if (all) return Promise.resolve(v6Only ? [] : [{ address: '127.0.0.1', family: 4 }]);
    return Promise.resolve({ address: '127.0.0.1', family: 4 });
  }
  return promisesLookup.call(this, hostname, options);
};
