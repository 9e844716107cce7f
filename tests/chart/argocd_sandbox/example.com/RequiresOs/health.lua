-- What Argo CD does offer: require("os"), with time and date only.
local os = require("os")
local now = os.time()
return {status = "Healthy",
        message = "the epoch is " .. os.date("!%Y-%m-%d", 0) .. "; now is a " .. type(now)
                  .. "; getenv is " .. type(os.getenv)}
