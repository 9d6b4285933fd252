// Starts fauxqs (the local SQS server) through its library API, bound to
// 127.0.0.1 only. Used by scripts/stack.sh and internal/testenv:
//
//   node --no-warnings scripts/fauxqs.mjs .tools/npm/node_modules/fauxqs/dist/app.js
//
// Why not its CLI: the CLI hard-codes logger: true, ignoring FAUXQS_LOGGER.
// Why the listen patch: fauxqs listens on 0.0.0.0 whatever FAUXQS_HOST says
// (that only names the host in the queue URLs it hands out), and a queue
// server open to the network would take a forged PaymentSucceeded from
// anyone. Settings: FAUXQS_PORT, FAUXQS_HOST, FAUXQS_LOGGER=true,
// FAUXQS_PERSISTENCE=true with FAUXQS_DATA_DIR.
import net from "node:net";
import { pathToFileURL } from "node:url";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (options, ...rest) {
  if (options !== null && typeof options === "object" && [undefined, "", "0.0.0.0", "::"].includes(options.host)) {
    options = { ...options, host: "127.0.0.1" };
  }
  return listen.call(this, options, ...rest);
};

const { startFauxqs } = await import(pathToFileURL(process.argv[2]).href);
await startFauxqs({
  logger: process.env.FAUXQS_LOGGER === "true",
  dataDir: process.env.FAUXQS_PERSISTENCE === "true" ? process.env.FAUXQS_DATA_DIR : undefined,
});
